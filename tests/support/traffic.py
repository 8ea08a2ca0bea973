"""Traffic probes for lab tests: which source address a datagram arrives with, and HTTP GETs
from inside a namespace."""

from __future__ import annotations

import subprocess
import sys

UDP_SOURCE = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999))
s.settimeout(10)
print("ready", flush=True)
data, peer = s.recvfrom(100)
print(peer[0], flush=True)
"""

HTTP_GET = """
import sys, urllib.error, urllib.request
try:
    reply = urllib.request.urlopen(sys.argv[1], timeout=3)
    print(reply.status)
    print(reply.read().decode(), end="")
except urllib.error.HTTPError as err:
    print(err.code)
    print(err.read().decode(), end="")
except OSError as err:
    print(0)
    print(err)
"""


def source_seen(src_ns: str, dst_ns: str, dst_ip: str) -> str:
    """The source address a UDP datagram from ``src_ns`` carries when it reaches ``dst_ns``."""
    listener = subprocess.Popen(["ip", "netns", "exec", dst_ns, sys.executable, "-c",
                                 UDP_SOURCE], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", src_ns, sys.executable, "-c",
                        f"import socket; socket.socket(2, 2).sendto(b'x', ({dst_ip!r}, 9999))"],
                       check=True, timeout=30)
        out, _ = listener.communicate(timeout=15)
        return out.strip()
    finally:
        listener.kill()


def http_get(netns: str, url: str) -> tuple[int, str]:
    """(status, body) of a GET made from inside ``netns``; status 0 if unreachable."""
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", HTTP_GET, url],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    status, _, body = out.partition("\n")
    return int(status or 0), body
