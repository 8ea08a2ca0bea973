"""The Kubernetes API client: the calls flanneld makes (``client``), where the API server is
and how to reach it (``config``: kubeconfig, in-cluster), the credentials (``auth``).
Imported only when flanneld runs with --kube-subnet-mgr."""
