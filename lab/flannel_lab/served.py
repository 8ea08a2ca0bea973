"""Serving an HTTP double from a thread inside a network namespace (the lab's metadata
services; the tests' cloud API doubles).

Must not touch: anything but the server it starts and stops.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flannel.kernel.host import Host

#: Seconds between the serving loop's checks for shut(): the longest a stop waits (the
#: standard library's 0.5 s made tests stop their servers in parallel threads).
POLL_INTERVAL = 0.05


def serve(handler: type[BaseHTTPRequestHandler], address: str, host: Host
          ) -> ThreadingHTTPServer:
    """Listen on ``address`` (a free port) inside ``host``'s namespace, served by threads."""
    with host.entered():  # the socket stays in that namespace; threads serve it from here
        server = ThreadingHTTPServer((address, 0), handler)
    threading.Thread(target=server.serve_forever, args=(POLL_INTERVAL,), daemon=True).start()
    return server


def endpoint(server: ThreadingHTTPServer | None) -> str:
    """``address:port`` where ``server`` listens."""
    assert server is not None, "the server is not started"
    address, port = server.server_address[:2]
    return f"{address!s}:{port}"


def shut(server: ThreadingHTTPServer | None) -> None:
    """Stop serving and close the socket (nothing if never started)."""
    if server is not None:
        server.shutdown()
        server.server_close()
