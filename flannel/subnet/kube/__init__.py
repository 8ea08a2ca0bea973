"""The Kubernetes API store: its subnet manager (``manager``), its API client (``client``),
kubeconfig reading (``config``), credentials (``auth``) and the node annotations it reads and
writes (``annotations``). Imported only when flanneld runs with --kube-subnet-mgr."""
