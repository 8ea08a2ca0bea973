"""What only the running flanneld knows, as its ``/status`` tells it: the peers it refuses now
and why (those whose entries the kernel refused are parked: left out, retried with backoff),
and whether its rules drop the encapsulation pods send.

Owns asking the flanneld of this network namespace once, over its local socket (found as
every ``flannelctl`` verb finds it: ``flannel/ops/locate.py``, ``discover.py``; fetched by
``flannel/ops/status.py``, read as ``flannel/monitor/statusdoc.py`` declares), and keeping
the fields it uses, bounded. When it cannot be read, ``unread`` says why,
for a "not checked: ... because ..." of the tools. ``doctor`` and ``check`` share it.
Must not touch: anything (one GET of /status).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flannel.monitor.statusdoc import Read
    from flannel.ops.discover import Flanneld

#: Seconds flanneld has to answer.
TIMEOUT = 3.0
#: Refusals read at most (flanneld lists 50), and the characters kept of each reason.
MAX_REFUSED = 1000
MAX_REASON = 2000


@dataclass(frozen=True)
class FlanneldView:
    """``refused``: lease key -> (kind, why) of every peer flanneld lists as refused now
    (kinds as ``/status`` names them: ``kernel_refused`` for a parked peer, ``engine``,
    ``identity_taken``, ``invalid_data``); ``unlisted``: refusals it counts but does not
    list; ``pod_encap_drop``: whether its rules drop pods' encapsulation (None: unknown, its
    rules not set up yet); ``unread``: why nothing could be read ("" when read)."""

    refused: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    unlisted: int = 0
    pod_encap_drop: bool | None = None
    unread: str = ""

    def of_kind(self, kind: str) -> dict[str, str]:
        """Lease key -> why, of the refusals of one kind."""
        return {key: why for key, (found, why) in self.refused.items() if found == kind}


def read_view(found: Flanneld | None, timeout: float = TIMEOUT) -> FlanneldView:
    """What the flanneld ``found`` running here says (None: none runs here)."""
    from flannel.ops.status import StatusUnavailable, fetch_status, where_of

    if found is None:
        return FlanneldView(unread="no flanneld runs in this network namespace")
    try:
        doc = fetch_status(where_of(found), timeout)
    except StatusUnavailable as err:
        return FlanneldView(unread=f"flanneld's /status could not be read: {err}")
    return view_of(doc)


def view_of(read: Read) -> FlanneldView:
    """The parts of a ``/status`` document the tools use (read as its schema declares: what
    is not of its shape is left out, never trusted)."""
    peers, rules = read.doc["peers"], read.doc["rules"]
    refused = {key: (kind, peers["refused_reasons"][key][:MAX_REASON])
               for key, kind in list(peers["refused_kinds"].items())[:MAX_REFUSED]
               if key in peers["refused_reasons"]}
    unlisted = max(0, peers["refused"] - len(refused))
    return FlanneldView(refused, unlisted,
                        "pod_encap_drop" in rules if rules is not None else None)
