"""The probe sequence for one peer and IP family, and what its answers tell: the peer
reached, or why not (the cause).

Run by flanneld (``flannel/probing/prober.py``, continuously); ``flannelctl doctor`` and
``check`` read its results where they are fresh. What is probed comes from the backend's
description of the peer (``flannel/backend/plan.py``): the address that answers over the
overlay, the public address on the underlay, the carrier; and the pods' MTU.

1. One don't-fragment echo of the pods' MTU to the peer's overlay address, from ours (a
   small one when the MTU is not known). Answered: the path carries what pods send, both
   ways; done, with its round trip. This is all a healthy peer costs.
2. Unanswered: at once, ``tries`` small echoes over the overlay, ``tries`` echoes to the
   peer's public address on the underlay (and, where this node's underlay MTU is known, a
   don't-fragment one of that MTU), and, where the carrier can be probed
   (``Carrier.refuses``: nothing but it receives on its UDP ports and it answers no stray
   datagram), ``tries`` datagrams to each of its UDP ports. Then:
   - small ones answered: one more echo of the pods' MTU, alone (a carrier that batches
     the packets to one peer, as the udp backend's forwarder does with UDP segmentation
     offload, could carry a full-size one beside the small ones where a link would not),
     waiting a little more than the small ones took. Answered: reached (the first was
     lost); not: ``mtu_too_small``, and the underlay's full-size echo says whether the
     underlay itself is narrower somewhere (a node or a link) or the carrier does not carry
     the pods' MTU;
   - nothing over the overlay nor on the underlay: ``peer_down`` (down, unreachable, or it
     drops ICMP);
   - the underlay answers, a UDP port of the carrier answers port unreachable (from the
     peer itself): ``encap_refused``, nothing listens there (or a firewall rejects it);
   - the underlay answers, the carrier's ports are silent (or a firewall answers
     "prohibited"): ``encap_blocked``, naming the ports and protocols;
   - the underlay answers and the carrier cannot be probed (plain routing, a cloud's
     router, an extension's own data path): ``overlay_down``, saying why nothing finer can
     be told.
An echo this node cannot send (our firewall, no route: flanneld's own state, repaired by its
data plane) or a flood of answers makes the outcome ``inconclusive``: nothing is concluded.
An echo of the pods' MTU refused here as larger than the device's MTU is ``mtu_too_small``
on this node's side.
Must not touch: anything but the pinger's sockets.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable
from dataclasses import dataclass

from flannel.backend.plan import Carrier, IPAddress
from flannel.probing.icmp import ICMP_HEADERS, SMALL, Datagrams, Echo, Pinger

OK = "ok"
PEER_DOWN = "peer_down"
ENCAP_BLOCKED = "encap_blocked"
ENCAP_REFUSED = "encap_refused"
OVERLAY_DOWN = "overlay_down"
MTU_TOO_SMALL = "mtu_too_small"
#: Every cause, in the order they are shown; each with the words an operator reads.
CAUSES = {PEER_DOWN: "peer down", ENCAP_BLOCKED: "encapsulation blocked",
          ENCAP_REFUSED: "encapsulation refused", OVERLAY_DOWN: "overlay down",
          MTU_TOO_SMALL: "MTU too small"}
#: Seconds between the tries of one step, and what each echo waits by default.
SPACING = 0.25
TIMEOUT = 1.0
TRIES = 2
#: What the lone full-size echo after answered small ones waits, besides 4 of their round
#: trips: a full-size packet takes no longer than a small one but for its serialization.
RETRY = 0.25
#: The longest one probe takes: its first echo, the second round, the lone retry.
LONGEST = 3 * TIMEOUT + (TRIES - 1) * SPACING
#: Why a flood makes a probe conclude nothing.
FLOODED = "a flood of ICMP answers was arriving"


@dataclass(frozen=True, slots=True)
class Path:
    """What to probe for one peer in one IP family: ``overlay``, its address that answers
    over the overlay (``FamilyPlan.answers_on``), ``public`` its address on the underlay,
    ``carrier`` what carries the overlay; ``mtu`` the pods' MTU (0: unknown, no full-size
    echo), ``underlay_mtu`` this node's underlay interface's (0: unknown)."""

    version: int
    overlay: IPAddress
    public: IPAddress
    carrier: Carrier
    mtu: int = 0
    underlay_mtu: int = 0

    @property
    def node(self) -> str:
        """How the peer is named: ``node 192.168.111.12``, ``... over IPv6``."""
        return f"node {self.public}" + (" over IPv6" if self.version == 6 else "")


@dataclass(frozen=True)
class Outcome:
    """What a probe told: ``cause`` (``OK`` or one of ``CAUSES``), the overlay's round trip
    when it answered, what was seen (``detail``, for the log and /status: it names the
    peer, and the carrier's ports where they matter); ``inconclusive``: why nothing can be
    concluded ("" when something can: ``cause`` holds then); ``underlay_carries``: for
    ``mtu_too_small``, whether the underlay carried an echo of its own MTU (None: not
    probed)."""

    cause: str
    rtt: float | None = None
    detail: str = ""
    inconclusive: str = ""
    underlay_carries: bool | None = None

    @property
    def reached(self) -> bool:
        return self.cause == OK and not self.inconclusive


def _size(path: Path, mtu: int) -> int:
    return max(SMALL, mtu - ICMP_HEADERS[path.version])


def probeable(carrier: Carrier) -> bool:
    """Whether silence on the carrier's UDP ports tells a drop (see the module docstring)."""
    return carrier.refuses and bool(carrier.udp_ports) and not carrier.unprobed


def _why_not_probed(carrier: Carrier) -> str:
    if not carrier.udp_ports and not carrier.ip_protocols and not carrier.unprobed:
        return ""
    return carrier.unprobed or f"nothing tells a dropped {carrier.ports_text} from an open one"


async def probe_path(pinger: Pinger, path: Path, *, tries: int = TRIES,
                     timeout: float = TIMEOUT, spacing: float = SPACING) -> Outcome:
    """The sequence of the module docstring for ``path``; echoes over the overlay leave
    from the pinger's overlay address."""
    size = _size(path, path.mtu) if path.mtu else SMALL
    first = await pinger.echo(path.overlay, size=size, timeout=timeout)
    if first.rtt is not None:
        return Outcome(OK, first.rtt)
    if first.flooded:
        return Outcome(OK, inconclusive=FLOODED)
    if first.send_error:
        return _unsent(path, first, size)
    carrier = path.carrier
    echo = pinger.echo
    small = echo(path.overlay, tries=tries, spacing=spacing, timeout=timeout)
    under = echo(path.public, tries=tries, spacing=spacing, timeout=timeout, overlay=False)
    wide: Awaitable[Echo | None] = echo(
        path.public, size=_size(path, path.underlay_mtu), tries=tries, spacing=spacing,
        timeout=timeout, overlay=False) if path.mtu and path.underlay_mtu else _nothing()
    ports = [pinger.datagrams(path.public, port, tries=tries, spacing=spacing, timeout=timeout)
             for port in (carrier.udp_ports if probeable(carrier) else ())]
    overlay, underlay, underlay_wide, datagrams = await asyncio.gather(
        small, under, wide, asyncio.gather(*ports))
    if overlay.flooded or underlay.flooded or any(d.flooded for d in datagrams):
        return Outcome(OK, inconclusive=FLOODED)
    if overlay.rtt is not None:
        if not path.mtu:
            return Outcome(OK, overlay.rtt)
        again = await echo(path.overlay, size=size,
                           timeout=min(timeout, RETRY + 4 * overlay.rtt))
        if again.rtt is not None:
            return Outcome(OK, again.rtt)
        if again.flooded:
            return Outcome(OK, inconclusive=FLOODED)
        return _narrow(path, overlay.rtt, underlay_wide)
    if overlay.send_error:
        return _unsent(path, overlay, SMALL)
    if underlay.rtt is None:
        said = f" ({underlay.error})" if underlay.error else ""
        return Outcome(PEER_DOWN, detail=f"{path.node} does not answer on the underlay "
                       f"({path.public}){said} nor over the overlay ({path.overlay}): it is "
                       "down, unreachable from here, or drops ICMP")
    return _overlay_cause(path, list(datagrams))


async def _nothing() -> Echo | None:
    return None


def _unsent(path: Path, echo: Echo, size: int) -> Outcome:
    """An echo this node could not send: larger than its own device carries, or refused
    here (a firewall, no route yet)."""
    if echo.send_errno == errno.EMSGSIZE and size > SMALL:
        return Outcome(MTU_TOO_SMALL, detail=f"packets of {path.mtu} bytes (the pods' MTU) "
                       f"cannot leave this node for {path.node}: the device they take to "
                       f"{path.overlay} has a smaller MTU")
    return Outcome(OK, inconclusive=f"this node cannot send echoes to {path.overlay}: "
                   f"{echo.send_error}")


def _narrow(path: Path, rtt: float, wide: Echo | None) -> Outcome:
    """Small echoes cross the overlay, those of the pods' MTU do not: where is it narrow?
    ``wide``: what the echo of this node's underlay MTU to the peer gave (None: none)."""
    head = (f"packets of {path.mtu} bytes (the pods' MTU) do not reach {path.node} over the "
            "overlay while small ones do")
    if wide is None:
        return Outcome(MTU_TOO_SMALL, rtt, head)
    if wide.rtt is None:
        return Outcome(MTU_TOO_SMALL, rtt, f"{head}; the underlay path to {path.public} does "
                       f"not carry {path.underlay_mtu}-byte packets either: that node, or a "
                       "link between, has a smaller MTU", underlay_carries=False)
    return Outcome(MTU_TOO_SMALL, rtt, f"{head}; the underlay carries {path.underlay_mtu}-"
                   f"byte packets to it: {path.carrier.name} does not carry the pods' MTU",
                   underlay_carries=True)


def _overlay_cause(path: Path, datagrams: list[Datagrams]) -> Outcome:
    """The underlay answers, the overlay does not: what the carrier's ports said."""
    carrier = path.carrier
    why = _why_not_probed(carrier) if not datagrams else ""
    if not datagrams:
        told = f"; {carrier.name} is not checked: {why}" if why else f" ({carrier.name})"
        return Outcome(OVERLAY_DOWN, detail=f"{path.node} answers on the underlay, but "
                       f"{path.overlay} does not answer over the overlay{told}: its routes, "
                       "its forwarding rules, or, where it answers on its cni0 gateway, no "
                       "pod there yet")
    refused = [port for port, sent in zip(carrier.udp_ports, datagrams, strict=True)
               if sent.refused]
    if refused:
        ports = ", ".join(str(port) for port in refused)
        return Outcome(ENCAP_REFUSED, detail=f"{path.node} answers ping, but nothing listens "
                       f"on UDP {ports}, where {carrier.name} receives (port unreachable): its "
                       "device or the program serving it is gone there (is flanneld running "
                       "there?), or a firewall rejects it")
    said = next((sent.error for sent in datagrams if sent.error), "")
    how = f"is refused ({said})" if said else "gets no answer"
    return Outcome(ENCAP_BLOCKED, detail=f"{path.node} answers ping but {carrier.name} "
                   f"traffic to {carrier.ports_text} {how}: a firewall drops it (on that "
                   "node, this one, on the path or in a cloud security group)")
