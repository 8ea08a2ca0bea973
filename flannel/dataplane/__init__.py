"""The data plane: the reconcile loop that makes the kernel, and any engine, hold what the
backend describes (``loop``: ``Dataplane``), and what only it needs (``heap``: the C heap
handed back after a large pass). Imported by the daemon; below it the backends, engines and
kernel never import it."""
