"""The pyflannel version string (printed by ``flanneld --version``)."""

__version__ = "0.1.0"
