"""Time as flanneld's waiters read it: the ``Clock`` seam (``clock``: the real one, or one a
test advances) and the one backoff helper every retry loop uses (``backoff``). Below every
layer, so that the stores, the backends, the engines and the data plane can all take it."""
