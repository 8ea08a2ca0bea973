"""``--ip-blackhole-route``: a blackhole route for this node's pod subnet(s).

Owns blackhole routes with our protocol in the main table: the one per family for the
current lease is kept (with a high metric, so the pod bridge's connected route wins while it
exists), and blackholes left from a previous lease are removed.
Must not touch: unicast routes (the reconciler's), routes of other protocols.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from ipaddress import IPv4Network, IPv6Network

from flannel.kernel import rtnl
from flannel.kernel.host import LOCAL, Host

log = logging.getLogger(__name__)

BLACKHOLE_METRIC = 4242


def ensure_blackholes(sock: rtnl.Rtnl, subnets: list[IPv4Network | IPv6Network]) -> int:
    wanted = {rtnl.Route(str(net), None, 0, kind=rtnl.RTN_BLACKHOLE, metric=BLACKHOLE_METRIC)
              for net in subnets}
    have = {route for family in (socket.AF_INET, socket.AF_INET6)
            for route, proto, table in sock.routes(family)
            if route.kind == rtnl.RTN_BLACKHOLE and proto == rtnl.RTPROT_FLANNEL
            and table == rtnl.RT_TABLE_MAIN}
    ops = [("replace", r) for r in sorted(wanted - have)]
    ops += [("delete", r) for r in sorted(have - wanted)]
    failures = sock.run(ops) if ops else []
    if failures:
        raise failures[0]
    return len(ops)


async def keep_blackholes(subnets: list[IPv4Network | IPv6Network], interval: float,
                          host: Host = LOCAL) -> None:
    """Every ``interval`` seconds (the first after one interval, as upstream)."""
    sock = await asyncio.to_thread(rtnl.Rtnl, host)
    try:
        while True:
            await asyncio.sleep(interval)
            try:
                changed = await asyncio.to_thread(ensure_blackholes, sock, subnets)
            except OSError as err:
                log.error("could not ensure blackhole route(s): %s", err)
                continue
            if changed:
                log.info("blackhole route(s) for %s ensured", ", ".join(map(str, subnets)))
    finally:
        sock.close()
