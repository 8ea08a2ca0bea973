"""Probes to every peer, in parallel and bounded in time: overlay reachability, the
underlay, the encapsulation port, and the path MTU.

How a failing peer is told apart (a backend reaching peers through a VTEP, as vxlan; any
other with a route to each peer or one covering the Network stops after step 2):
1. ping the peer's VTEP address over the overlay from ours. An answer means the
   encapsulation works both ways; then step 4.
2. No answer: ping the peer's public IP on the underlay. No answer there either: the node
   is down or unreachable (or drops ICMP), whatever the port does.
3. The underlay answers: send a UDP datagram to the peer's VXLAN port. An ICMP
   port-unreachable comes back when nothing listens there (the peer's VXLAN device is gone:
   its flanneld is not running or not programmed); silence from a host that answers ping
   means something drops UDP to that port: a firewall on the peer, on the path, or a cloud
   security group. (The VXLAN driver itself never answers a datagram, so silence is also
   what a healthy port gives: that is why step 1 decides "works", not this one.)
4. Path MTU: ping the peer's VTEP with don't-fragment packets of the pods' MTU; when small
   packets arrive and full-size ones do not, probe the underlay at its own MTU to say where
   the packets are lost.
Must not change anything.
"""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from flannel.backend.footprint import COVERING, PER_PEER
from flannel.lease import Lease
from flannel.ops.checks import Context
from flannel.ops.findings import Finding

MAX_PARALLEL = 16
ICMP_HEADERS = 28  # IPv4 + ICMP echo headers, not counted in ping -s


def ping(target: str, *, source: str = "", size: int = 56, timeout: float = 1.0,
         count: int = 2) -> bool:
    cmd = [shutil.which("ping") or "ping", "-4", "-n", "-q", "-c", str(count), "-i", "0.2",
           "-W", f"{timeout:g}", "-s", str(size), "-M", "do"]
    if source:
        cmd += ["-I", source]
    try:
        proc = subprocess.run([*cmd, target], capture_output=True, check=False,
                              timeout=count * (timeout + 0.2) + 2, stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return False
    return proc.returncode == 0


def udp_port_refused(host: str, port: int, timeout: float) -> bool | None:
    """True when the host answers port-unreachable, False on silence, None if unsendable."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(timeout / 3)
            sock.connect((host, port))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    sock.send(b"flannelctl doctor probe")
                    sock.recv(64)
                except ConnectionRefusedError:
                    return True
                except TimeoutError:
                    continue
                except OSError as err:
                    if err.errno == errno.ECONNREFUSED:
                        return True
                    return None
    except OSError:
        return None
    return False


def _underlay_mtu(ctx: Context) -> int | None:
    link = ctx.kernel.link(ctx.device)
    name = ((link or {}).get("linkinfo", {}).get("info_data") or {}).get("link")
    underlay = ctx.kernel.link(name) if isinstance(name, str) else None
    mtu = (underlay or {}).get("mtu")
    return mtu if isinstance(mtu, int) else None


def probe_peer(ctx: Context, peer: Lease, own_vtep: str) -> list[Finding]:
    assert peer.subnet is not None  # ctx.peers holds only leases with a subnet
    public = str(peer.attrs.public_ip)
    timeout = ctx.probe_timeout
    node = f"node {public} ({peer.subnet})"
    described = ctx.described
    overlay = described is not None and described[1].vtep \
        and peer.attrs.backend_type == described[0]
    target = str(peer.subnet.network_address) if overlay else ""
    if overlay and ping(target, source=own_vtep, timeout=timeout):
        return probe_mtu(ctx, peer, own_vtep, node)
    if not ping(public, timeout=timeout):
        return [Finding("underlay", "error", f"{node} does not answer on the underlay: it is "
                        "down, unreachable from here, or drops ICMP",
                        f"check that the node is up and that this node reaches {public}")]
    if not overlay:
        return []
    port = ctx.encap_port
    refused = udp_port_refused(public, port, timeout)
    if refused:
        return [Finding("encap", "error", f"{node} answers ping, but nothing listens on UDP "
                        f"{port}: its VXLAN device is missing",
                        "is flanneld running there? run flannelctl doctor on that node")]
    return [Finding("encap", "error", f"{node} answers ping but VXLAN traffic to UDP {port} "
                    "gets no answer: a firewall drops it (on that node, on the path or in a "
                    "cloud security group)",
                    f"allow UDP {port} between all nodes (e.g. nft/iptables, firewalld "
                    f"--add-port={port}/udp, the security group); if it is open, run "
                    "flannelctl doctor on that node")]


def probe_mtu(ctx: Context, peer: Lease, own_vtep: str, node: str) -> list[Finding]:
    env_mtu = (ctx.env or {}).get("FLANNEL_MTU", "")
    if not env_mtu.isdigit() or int(env_mtu) <= ICMP_HEADERS:
        return []
    mtu = int(env_mtu)
    assert peer.subnet is not None  # ctx.peers holds only leases with a subnet
    target = str(peer.subnet.network_address)
    if ping(target, source=own_vtep, size=mtu - ICMP_HEADERS, timeout=ctx.probe_timeout):
        return []
    underlay = _underlay_mtu(ctx)
    where = ""
    if underlay and not ping(str(peer.attrs.public_ip), size=underlay - ICMP_HEADERS,
                             timeout=ctx.probe_timeout):
        where = (f"; the underlay path to {peer.attrs.public_ip} does not carry {underlay}-byte "
                 "packets either: that node, or a link between, has a smaller MTU")
    return [Finding("path-mtu", "error", f"packets of {mtu} bytes (the pods' MTU) do not reach "
                    f"{node} over the overlay while small ones do{where}",
                    "give every node's underlay interface the same MTU (or set Backend.MTU in "
                    "the network config to the smallest one), restart flanneld on every node, "
                    "then recreate the pods")]


def check_peers(ctx: Context) -> list[Finding]:
    footprint = ctx.footprint
    if not ctx.probe or footprint is None or footprint.routes not in (PER_PEER, COVERING) \
            or ctx.own_subnet is None:
        return []
    peers = [p for p in ctx.peers if p.subnet is not None]
    if not peers:
        return []
    own_vtep = str(ctx.own_subnet.network_address)
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(peers))) as pool:
        results = list(pool.map(lambda peer: probe_peer(ctx, peer, own_vtep), peers))
    return [finding for found in results for finding in found]


CHECKS = [("encap", check_peers)]
