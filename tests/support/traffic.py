"""Traffic probes for lab tests: which source address a datagram arrives with, HTTP GETs
from inside a namespace, and don't-fragment pings that say which MTU refused them."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

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


@dataclass(frozen=True)
class DfPing:
    """What a don't-fragment ping showed: whether an echo came back, and the MTU a refusal
    named, with where it came from: the sender's own link or route (``local``: "message too
    long", nothing sent) or a router on the path (ICMP fragmentation needed / packet too big)."""

    replied: bool
    mtu: int | None
    local: bool
    output: str


_MTU_NAMED = re.compile(r"\bmtu\s*[=:]\s*(\d+)")


def df_ping(netns: str, target: str, size: int, count: int = 1, within: float = 0.0
            ) -> DfPing:
    """Ping ``target`` from ``netns`` with don't-fragment packets of ``size`` bytes, IP
    header included (ICMP payload ``size`` - 28, IPv6 ``size`` - 48); with ``within``,
    echoes every 0.2 s until one is answered or ``within`` seconds passed; without, ``count``
    echoes 0.2 s apart, each waited for up to 2 s."""
    v6 = ":" in target
    payload = size - (48 if v6 else 28)
    timing = ["-i", "0.2", *(["-w", f"{within:g}"] if within else ["-W", "2"])]
    result = subprocess.run(["ip", "netns", "exec", netns, "ping", "-6" if v6 else "-4",
                             "-M", "do", "-s", str(payload), "-c", str(count), *timing,
                             target], capture_output=True, text=True,
                            timeout=count * 2 + within + 10, check=False)
    output = result.stdout + result.stderr
    named = _MTU_NAMED.search(output)
    return DfPing(result.returncode == 0, int(named[1]) if named else None,
                  "local error" in output, output)
