"""The udp backend's forwarder engine (Go flannel's wire format: bare IPv4 in UDP, port 8285).

What backend glue needs: ``device.ensure_tun(TunSpec(name, lease base, ext MTU - 28,
Network))`` from a worker thread (returns the drift it repaired), and one
``forwarder.UdpForwarder(ForwarderConfig(...))`` with ``start()`` (also after a death: the
last peer set is re-sent), ``set_peers({subnet: public IP})`` (whole set, in use on return),
``status()`` (alive, counters, CPU, last error) and ``stop()``. Config decoding (``Port``,
IPv4 only) and the lease (no BackendType, no BackendData) belong to the glue.
"""
