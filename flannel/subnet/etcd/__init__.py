"""The etcd v3 store: its subnet manager (``manager``), its API client (``client``) and the
free-subnet search it leases from (``candidates``). Imported only when flanneld uses etcd."""
