"""The monitoring wing: what flanneld tells about itself (health endpoints, metrics, the
status document, its local socket, systemd readiness), read from the node state the daemon
fills in. It stands beside the data plane: it reads node state, and the data plane, backends,
kernel and stores never import it (an import contract in pyproject.toml)."""
