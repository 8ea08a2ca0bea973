"""The commands Go flannel's image ships in /opt/bin beside flanneld, for the manifests and
units that run them: ``mk-docker-opts`` (``dockeropts``: subnet.env as Docker daemon options)
and ``install-conf`` (``installconf``: the CNI conflist installed atomically)."""
