"""The Kubernetes API store: its subnet manager (``manager``) and the node annotations it
reads and writes (``annotations``), over the API client of ``flannel.clients.kube``.
Imported only when flanneld runs with --kube-subnet-mgr."""
