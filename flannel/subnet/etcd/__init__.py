"""The etcd v3 store: its subnet manager (``manager``) and the free-subnet search it leases
from (``candidates``), over the client of ``flannel.clients.etcd``. Imported only when
flanneld uses etcd."""
