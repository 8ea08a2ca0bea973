"""flanneld's own probes of its peers, in a 3-node lab of every backend with a data path:
the peer n2's encapsulation port blocked, its underlay cut, its underlay MTU shrunk, its
flanneld stopped, each in turn and undone. n1 and n3 must list n2 in their /status with the
right cause within 2 probe intervals of the change (the ``since`` flanneld gives), and clear
it within 1 interval of the undo (the log line that says so); n1 and n3 keep reaching each
other meanwhile.

The situations are the truth matrix's (``tests/support/matrix.py``); what differs is the
assertion: flanneld's /status, not doctor's or check's answer. The cause each situation
gives depends on what the backend's carrier lets a probe tell (see
``flannel/probing/sequence.py``): a stopped flanneld leaves a data path that still carries
(vxlan, WireGuard, IPsec, host-gw, extension, cloud routes) except the udp backend's, whose
forwarder is flanneld itself.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from flannel.monitor.localsock import socket_path
from flannel.ops.status import StatusUnavailable, Where, fetch_status
from flannel.probing.sequence import LONGEST
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab
from tests.support import netns
from tests.support.matrix import (
    FLANNELCTL,
    LABS,
    PORTS,
    SITUATIONS,
    Cell,
    Matrix,
    network_config,
    skip_reason,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]

#: Seconds between two probes of a peer: short for the test; a failing probe takes ~2.3 s
#: (its first echo's timeout, then the underlay and the carrier's ports at once).
INTERVAL = 3
PEER, WATCHERS = 2, (1, 3)
REACHED = "reached"

_numbers = itertools.count(1)


@dataclass(frozen=True)
class Case:
    """A situation made on n2 and the cause n1 and n3 must give it (``REACHED``: none)."""

    situation: str
    cause: str


def cases(key: str) -> list[Case]:
    backend = LABS[key].backend
    out = []
    if (backend, 4) in PORTS:
        out.append(Case("peer-port-nft", "encap_blocked"))
    out.append(Case("underlay-cut", "peer_down"))
    out.append(Case("underlay-mtu", "mtu_too_small"))
    # The udp backend's forwarder is flanneld: nothing listens on 8285 once it stops. Every
    # other data path outlives its flanneld.
    out.append(Case("peer-stopped", "encap_refused" if backend == "udp" else REACHED))
    return out


BACKENDS = ["vxlan", "host-gw", "udp", "wireguard", "ipsec", "extension", "aws-vpc", "gce",
            "ali-vpc"]


def listed(m: Matrix, index: int) -> dict[str, dict[str, object]]:
    """Lease key -> what node ``index``'s flanneld lists unreachable: the document
    ``flannelctl status --json`` prints, read from flanneld's socket as it reads it: polled
    every 0.3 s, a flannelctl started each time cost ~0.17 s of CPU, half the test's."""
    socket = socket_path(m.node(index).subnet_file)  # type: ignore[attr-defined]
    try:
        doc = fetch_status(Where(socket=socket), timeout=10).doc
    except StatusUnavailable:
        return {}
    probes = doc.get("probes") or {}
    return {str(item["lease"]): dict(item) for item in probes.get("listed") or []
            if item.get("family") == 4}


_KLOG = re.compile(r"^[IWE](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})")


def logged_at(m: Matrix, index: int, words: str, after: float) -> float | None:
    """When (wall clock) node ``index``'s flanneld first logged a line holding ``words``
    after ``after``; None if it has not."""
    log = Path(m.node(index).log_file)  # type: ignore[attr-defined]
    year = datetime.now().year
    for line in log.read_text(errors="replace").splitlines():
        found = _KLOG.match(line)
        if not found or words not in line:
            continue
        month, day, hour, minute, second, micro = (int(part) for part in found.groups())
        at = datetime(year, month, day, hour, minute, second, micro).astimezone().timestamp()
        if at >= after:
            return at
    return None


def expect(m: Matrix, cause: str, lease: str, timeout: float) -> dict[int, dict[str, object]]:
    """Wait until n1 and n3 give n2 ``cause``; what each lists of it."""
    seen: dict[int, dict[str, object]] = {}

    def done() -> bool:
        for index in WATCHERS:
            item = listed(m, index).get(lease)
            if cause == REACHED:
                if item is not None:
                    return False
            elif item is None or item["cause"] != cause:
                return False
            else:
                seen[index] = item
        return True

    wait_until(done, timeout, interval=0.3,
               what=f"n1 and n3 giving n2 ({lease}) {cause}")
    return seen


def tools_read_flanneld(m: Matrix, peer: str) -> None:
    """doctor and check on n1 take flanneld's fresh result for the blocked peer (no
    ``--max-age``: its probe period) and say so; with ``--max-age=0`` they probe."""
    where = (f"--etcd-endpoints={m.endpoint}",
             f"--subnet-file={m.node(1).subnet_file}")  # type: ignore[attr-defined]
    doc = json.loads(m.run_in(1, *FLANNELCTL, "check", "--json", *where, check=False).stdout)
    row = m.row(doc, PEER, 4)
    assert row["verdict"] == "timeout", row  # as check's own echoes find it, below
    assert "flanneld's own probe" in str(row["detail"]) and "UDP 8472" in str(row["detail"])
    own = m.row(json.loads(m.run_in(1, *FLANNELCTL, "check", "--json", "--max-age=0", *where,
                                    "--timeout=0.5", check=False).stdout), PEER, 4)
    assert own["verdict"] == "timeout", own
    proc = m.run_in(1, *FLANNELCTL, "doctor", "--json", *where, "--probe-timeout=0.5",
                    check=False)
    findings = json.loads(proc.stdout)["findings"]
    encap = [f for f in findings if f["check"] == "encap"]
    assert encap and peer in encap[0]["what"] and "flanneld's own probe" in encap[0]["what"], \
        findings
    assert any(f["check"] == "probes" and "judged from flanneld's own probes" in f["what"]
               for f in findings), findings


@pytest.mark.parametrize("key", BACKENDS)
def test_every_situation_is_reported_with_its_cause_and_cleared(key: str, tmp_path: Path):
    reason = skip_reason(key)
    if reason:
        pytest.skip(reason)
    spec = LABS[key]
    lab = Lab(f"{netns.RUN_PREFIX}P{next(_numbers)}", root=tmp_path)
    try:
        nodes = build(lab, 3, network_config(spec, lab),
                      flanneld_args=("--ip-masq", f"--peer-probe-interval={INTERVAL}", "-v=1"))
        wait_for_mesh(lab, nodes, spec.ipv6, timeout=60)
        m = Matrix(lab, spec)
        lease = str(lab.lease_key(PEER))
        expect(m, REACHED, lease, 4 * INTERVAL + 10)
        for case in cases(key):
            cell = Cell(key, case.situation, peer=PEER)
            situation = SITUATIONS[case.situation]
            cause = case.cause
            applied = time.time()
            situation.apply(m, cell)
            try:
                if cause == REACHED:
                    # Nothing to report: it must stay so for 2 intervals.
                    deadline = time.monotonic() + 2 * INTERVAL
                    while time.monotonic() < deadline:
                        expect(m, REACHED, lease, 0.5)
                else:
                    seen = expect(m, cause, lease, 2 * INTERVAL + 15)
                    for index, item in seen.items():
                        since = datetime.fromisoformat(str(item["since"])).timestamp()
                        # Within 2 intervals and one probe's longest run (/status gives
                        # whole seconds), with room for a loaded machine's slower loop.
                        assert since - applied <= 2 * INTERVAL + LONGEST + 5, (index, item)
                        assert str(m.address(PEER)) in str(item["detail"]), item
                        if cause == "encap_blocked":  # the carrier's port is named
                            port = PORTS[(spec.backend, 4)][0]
                            assert f"UDP {port}" in str(item["detail"]), item
                    if key == "vxlan" and case.situation == "peer-port-nft":
                        tools_read_flanneld(m, str(m.address(PEER)))
            finally:
                undoing = time.time()
                situation.undo(m, cell)
                undone = time.time()  # a stopped flanneld is running again
            if cause != REACHED:
                expect(m, REACHED, lease, INTERVAL + 15)
                for index in WATCHERS:
                    at = logged_at(m, index, "reachable again", undoing)
                    assert at is not None, index
                    assert at - undone <= INTERVAL + LONGEST + 5, (index, at - undone)
    finally:
        lab.down()
