"""A lab lent to one test after another: built once, checked before each next test, rebuilt
when a test left it other than it was built (or said it spoiled it).

It models what a fresh lab gives each test, for the price of one build: a test borrows the lab,
makes its fault and undoes it (flanneld repairs its own objects once it runs again; the test
undoes the rest), and the lab goes to the next test only once it is back to its fingerprint,
taken when it was built:

- in each of its namespaces: the links and addresses (MTU, MAC, state, VXLAN port...), every
  route of every table of both families, the permanent neighbours and FDB entries, the IPv4
  sysctls and IPv6 forwarding, the nftables ruleset (``nft -s``, so the iptables-nft tables
  too, without counters), and the offloads of flanneld's devices;
- the store's keys under the lab's prefix (config and leases), every node's subnet.env;
- every node's flanneld: running, not stopped (SIGSTOP), with the command line it was built
  with (a flanneld restarted as it was is the lab as built; killed, left stopped or run with
  other flags is not);
- what the test module adds (``extra``: its CNI directories, say);
- and every pair of nodes pinging each other's pods.

What changes on its own (counters, timers, learned neighbours) is left out. When the next test
borrows the lab, a lab that does not come back within ``settle`` seconds (scaled by the lab's
slowness factor) is torn down and that test gets a new one: one test's leftovers never reach
another's verdict, they only cost a build. Not compared: the legacy iptables tables (flanneld
programs iptables-nft), conntrack, and what a vxlan lab has none of (WireGuard peers, charon's
SAs): a lab of those backends needs them in its ``extra``.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from flannel_lab import slowness
from flannel_lab.cli import has_data_path
from flannel_lab.cluster import ETCD_PREFIX, Lab, in_ns

#: Fields of ``ip -d`` output that tick on their own (the bridges' STP timers), route expiries,
#: and link indexes (a device flanneld deleted and made again has a new one, and is the same).
_VOLATILE = re.compile(r"\b\w+_timer\s+\S+|\bexpires\s+\S+|^\d+: |@if\d+", re.MULTILINE)


def blocks(text: str, start: str) -> list[str]:
    """``text`` cut before every line starting with ``start``, in order of their text (a
    device or chain made again comes last in a listing, and is the same)."""
    return sorted(block.strip() for block in re.split(f"\n(?={start})", text))


def ruleset(text: str) -> list[str]:
    """``nft -s list ruleset``, each table's chains in order of their text."""
    tables = []
    for table in blocks(text, "table "):
        head, *chains = re.split("\n(?=\tchain )", table.removesuffix("}"))
        tables.append("\n".join([head, *sorted(chain.strip() for chain in chains)]))
    return tables


def namespace_state(netns: str) -> str:
    """The kernel state of ``netns`` a test could change and a later one could see."""
    links = in_ns(netns, "ip", "-d", "addr", "show").stdout
    out = blocks(_VOLATILE.sub("", links), r"\S")
    for family in ("-4", "-6"):  # in any order: a link set up again adds its routes last
        out += sorted(_VOLATILE.sub("", line) for line in in_ns(
            netns, "ip", family, "route", "show", "table", "all").stdout.splitlines())
    out.append(in_ns(netns, "ip", "neigh", "show", "nud", "permanent").stdout)
    out += sorted(line for line in in_ns(netns, "bridge", "fdb", "show").stdout.splitlines()
                  if "permanent" in line)
    out.append(in_ns(netns, "sysctl", "net.ipv4.ip_forward", "net.ipv4.conf",
                     "net.ipv6.conf.all.forwarding").stdout)
    out += ruleset(in_ns(netns, "nft", "-s", "list", "ruleset").stdout)
    for device in re.findall(r"^\d+: (flannel[^:@]*)", links, re.MULTILINE):
        out.append(in_ns(netns, "ethtool", "-k", device, check=False).stdout)
    return "\n".join(out)


def _proc_state(pid: int) -> str:
    """``pid``'s command line and whether it is stopped ("" when it is gone)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    state = stat.rsplit(")", 1)[1].split()[0]
    return f"{cmdline!r} {'stopped' if state in 'tT' else 'zombie' if state in 'ZX' else 'up'}"


def processes(lab: Lab) -> list[str]:
    """Every node's flanneld as it runs (empty for a node whose flanneld is gone)."""
    return [f"node {node.index}: " + ("" if lab.flanneld_gone(node.index)
                                      else _proc_state(node.pid)) for node in lab.state.nodes]


def lost(now: list[str]) -> bool:
    """Whether a flanneld is gone or stopped: nothing brings it back on its own."""
    return any(line.endswith((": ", " stopped", " zombie")) for line in now)


def fingerprint(lab: Lab, extra: Callable[[Lab], object]) -> list[str]:
    """What a test must leave as it found: see the module's docstring."""
    parts = [namespace_state(ns) for ns in lab.state.namespaces]
    parts.append(lab.etcdctl("get", "--prefix", f"{ETCD_PREFIX}/"))
    for node in lab.state.nodes:
        path = Path(node.subnet_file)
        parts.append(path.read_text() if path.exists() else "(no subnet.env)")
    parts.append(repr(extra(lab)))
    return parts


def mesh_answers(lab: Lab) -> bool:
    """Whether every node pings every other node's pods, in each family the lab carries."""
    if not has_data_path(lab):
        return True
    indexes = [node.index for node in lab.state.nodes]
    return all(lab.ping(a, b, v6=v6) for v6 in {False, lab.state.ipv6} for a in indexes
               for b in indexes if a != b)


def difference(new: str, old: str) -> str:
    """The lines ``new`` has instead of ``old``'s (at most a few)."""
    lines = [line for line in difflib.unified_diff(old.splitlines(), new.splitlines(),
                                                    lineterm="", n=0)
             if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return "; ".join(lines[:6])


class SharedLab:
    """Lends one lab, built by ``build`` on a lab ``make`` names, to test after test (see the
    module's docstring). ``discarded`` says, per lab thrown away, what its last borrower left
    different."""

    def __init__(self, make: Callable[[], Lab], build: Callable[[Lab], None], *,
                 extra: Callable[[Lab], object] = lambda lab: None, settle: float = 10.0
                 ) -> None:
        self._make, self._build, self._extra, self._settle = make, build, extra, settle
        self._lab: Lab | None = None
        self._processes: list[str] = []
        self._fingerprint: list[str] = []
        self.discarded: list[str] = []
        self._spoiled = ""

    def spoil(self, why: str) -> None:
        """Have the lab thrown away before the next test: for a test that leaves it in a way
        the fingerprint may not show yet (a flanneld that is ending, say)."""
        self._spoiled = why

    @contextlib.contextmanager
    def lend(self) -> Iterator[Lab]:
        """The lab, as built, for one test: what the last test left is checked first (and
        the lab thrown away for a new one if it is not back to its fingerprint), whether that
        test passed or not; the last test's leftovers concern no one."""
        if self._lab is not None:
            self._check(self._lab)
        if self._lab is None:
            lab = self._make()
            self._lab = lab
            self._build(lab)
            self._processes, self._fingerprint = self._settled(lab)
        yield self._lab

    def _check(self, lab: Lab) -> None:
        changed, self._spoiled = self._spoiled or self._difference(lab), ""
        if changed:
            # Said on the test's stderr: which test leaves what it should have undone.
            print(f"shared lab {lab.name} thrown away: {changed}", file=sys.stderr)
            self.discarded.append(changed)
            self._lab = None
            lab.down()

    def _settled(self, lab: Lab) -> tuple[list[str], list[str]]:
        """The new lab's processes and fingerprint, once it is the same twice in a row and
        its IPv6 addresses are past duplicate detection."""
        deadline = time.monotonic() + slowness.scaled(self._settle)
        before = (processes(lab), fingerprint(lab, self._extra))
        while True:
            time.sleep(0.2)
            now = (processes(lab), fingerprint(lab, self._extra))
            if now == before and not any(" tentative" in part for part in now[1]):
                return now
            if time.monotonic() > deadline:
                raise AssertionError(f"the shared lab {lab.name} does not settle after "
                                     f"{slowness.within(self._settle)}")
            before = now

    def _difference(self, lab: Lab) -> str:
        """What differs from the lab as built ("" once it is back, within ``settle``)."""
        deadline = time.monotonic() + slowness.scaled(self._settle)
        while True:
            now = processes(lab)
            parts = fingerprint(lab, self._extra)
            if (now, parts) == (self._processes, self._fingerprint) and mesh_answers(lab):
                return ""
            if time.monotonic() > deadline or lost(now):
                if now != self._processes:
                    return f"flanneld: {now} (built: {self._processes})"
                return next((difference(new, old) for new, old in
                             zip(parts, self._fingerprint, strict=True) if new != old),
                            "the mesh does not answer")
            time.sleep(0.2)
