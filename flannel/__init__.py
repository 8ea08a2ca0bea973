"""pyflannel: a Python implementation of flannel, wire-compatible with Go flannel.

The package is split as upstream: ``subnet`` (lease stores) knows nothing of the kernel,
``backend`` knows nothing of the store, and ``daemon`` wires the two.
"""
