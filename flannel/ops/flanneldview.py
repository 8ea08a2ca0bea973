"""What only the running flanneld knows, as its ``/status`` tells it: the peers it refuses now
and why (those whose entries the kernel refused are parked: left out, retried with backoff),
and whether its rules drop the encapsulation pods send.

Owns asking the flanneld of this network namespace once, over its local socket (found as
every ``flannelctl`` verb finds it: ``flannel/ops/locate.py``, ``discover.py``; fetched by
``flannel/ops/status.py``), and reading the answer as untrusted input: only the fields it
uses, of the types they must have, bounded. When it cannot be read, ``unread`` says why,
for a "not checked: ... because ..." of the tools. ``doctor`` and ``check`` share it.
Must not touch: anything (one GET of /status).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def view_of(doc: Mapping[str, Any]) -> FlanneldView:
    """The parts of a ``/status`` document the tools use; what is not of its shape is left
    out, never trusted."""
    peers = doc.get("peers")
    peers = peers if isinstance(peers, dict) else {}
    reasons, kinds = peers.get("refused_reasons"), peers.get("refused_kinds")
    refused: dict[str, tuple[str, str]] = {}
    if isinstance(reasons, dict) and isinstance(kinds, dict):
        for key, why in list(reasons.items())[:MAX_REFUSED]:
            kind = kinds.get(key)
            if isinstance(key, str) and isinstance(why, str) and isinstance(kind, str):
                refused[key] = (kind, why[:MAX_REASON])
    count = peers.get("refused")
    unlisted = max(0, count - len(refused)) if isinstance(count, int) else 0
    rules = doc.get("rules")
    return FlanneldView(refused, unlisted,
                        "pod_encap_drop" in rules if isinstance(rules, dict) else None)
