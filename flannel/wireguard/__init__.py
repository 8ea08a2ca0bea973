"""The wireguard backend's engine: config and lease data (``config.py``), the key file
(``keys.py``), the UAPI socket of wireguard-go (``uapi.py``) and the kernel's generic
netlink family (``genl.py``), the device, kernel or wireguard-go (``device.py``), and the
peer reconciler (``peers.py``)."""
