"""The lab: throw-away clusters on one machine, in network namespaces, for demos and tests.

Nothing here is used by flanneld itself.
"""
