"""The wireguard backend's engine: config and lease data (``config.py``), the key file
(``keys.py``), the UAPI and ``wg`` transports (``uapi.py``), the device, kernel or
wireguard-go (``device.py``), and the peer reconciler (``peers.py``)."""
