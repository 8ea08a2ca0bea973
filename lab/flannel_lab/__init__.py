"""The lab: throw-away clusters on one machine, in network namespaces, for demos and tests.

A distribution of its own (``lab/pyproject.toml``, ``flannel-lab``): it runs and imports
pyflannel; pyflannel never imports it, and neither its wheel nor the image carries it.
"""
