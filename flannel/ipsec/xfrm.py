"""The kernel's side of the ipsec backend: whether it carries ESP, and Go's XFRM policies.

Owns: the ESP probe (an ESP state with an AEAD cipher added to and deleted from the
namespace's XFRM database under a reserved SPI: refused means no ESP in the kernel, and charon
then carries ESP in userspace through kernel-libipsec), and, where the kernel carries ESP, the
three policies Go flannel installs per peer pair (out: local subnet -> remote subnet, in and
fwd: remote -> local; ESP tunnel template between the public addresses, reqid 11), through
``ip xfrm`` (iproute2; argv, never a shell).
API: ``kernel_has_esp(netns)``, ``policy_commands(pair, action)``, ``run(argv, netns)``,
``our_policies(netns)`` (the policies of that shape present: for ``flannelctl cleanup``),
``sync_policies(pairs, netns)`` (exactly the pairs' policies of that shape: missing ones
added, others of that shape deleted).
Must not touch: states or policies other than those named here.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from flannel.ipsec.config import REQID, Pair

# A documentation address pair and an SPI no IKE daemon hands out (below 256 is reserved).
_PROBE = ("src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "spi", "0x000000fe")
_PROBE_KEY = "0x" + "00" * 20
TIMEOUT = 10.0


class XfrmError(Exception):
    """``ip xfrm`` failed; the message holds its words."""


def _ip(netns: str | None) -> list[str]:
    return ["ip", *(["-n", netns] if netns else []), "xfrm"]


def run(argv: Sequence[str], netns: str | None) -> str:
    try:
        done = subprocess.run([*_ip(netns), *argv], capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise XfrmError(f"ip xfrm {' '.join(argv[:2])}: {err}") from None
    if done.returncode != 0:
        raise XfrmError(f"ip xfrm {' '.join(argv[:2])}: {done.stderr.strip()[:300]}")
    return done.stdout


# One policy as `ip xfrm policy list` prints it, with a single ESP tunnel template.
_POLICY = re.compile(
    r"^src (?P<src>\S+) dst (?P<dst>\S+)\s*\n\s+dir (?P<dir>in|out|fwd) .*\n"
    r"\s+tmpl src \S+ dst \S+\s*\n\s+proto esp reqid (?P<reqid>\d+) mode tunnel\s*$",
    re.MULTILINE)


def our_policies(netns: str | None) -> list[list[str]]:
    """``ip xfrm policy delete`` argv (after ``ip xfrm``) for every policy with Go's shape:
    ESP tunnel template with reqid 11 (Go flannel's and ours)."""
    out = []
    for match in _POLICY.finditer(run(["policy", "list"], netns)):
        if match["reqid"] == str(REQID):
            out.append(["policy", "delete", "src", match["src"], "dst", match["dst"],
                        "dir", match["dir"]])
    return out


def kernel_has_esp(netns: str | None) -> bool:
    """Whether the kernel takes an ESP state (AES-GCM, as the default ESPProposal)."""
    try:
        run(["state", "add", *_PROBE, "mode", "tunnel", "aead", "rfc4106(gcm(aes))",
             _PROBE_KEY, "128"], netns)
    except XfrmError:
        return False
    try:
        run(["state", "delete", *_PROBE], netns)
    except XfrmError:
        pass  # gone already: nothing of the probe is left
    return True


def policy_commands(pair: Pair, action: str) -> list[list[str]]:
    """``ip xfrm policy`` argv (after ``ip xfrm``) for the pair's three policies;
    ``action``: "update" (add or replace) or "delete"."""
    out_sel = ["src", str(pair.local_subnet), "dst", str(pair.remote_subnet)]
    in_sel = ["src", str(pair.remote_subnet), "dst", str(pair.local_subnet)]
    out_tmpl = ["src", str(pair.local_ip), "dst", str(pair.remote_ip)]
    in_tmpl = ["src", str(pair.remote_ip), "dst", str(pair.local_ip)]
    tmpl = ["proto", "esp", "reqid", str(REQID), "mode", "tunnel"]
    commands = []
    for direction, selector, ends in (("out", out_sel, out_tmpl), ("in", in_sel, in_tmpl),
                                      ("fwd", in_sel, in_tmpl)):
        argv = ["policy", action, *selector, "dir", direction]
        if action != "delete":
            argv += ["tmpl", *ends, *tmpl]
        commands.append(argv)
    return commands


def sync_policies(pairs: Sequence[Pair], netns: str | None) -> int:
    """Make the policies of Go's shape exactly those of ``pairs``; the changes made."""
    present = {tuple(argv[2:]) for argv in our_policies(netns)}
    wanted: dict[tuple[str, ...], list[str]] = {}
    for pair in pairs:
        for update, delete in zip(policy_commands(pair, "update"),
                                  policy_commands(pair, "delete"), strict=True):
            wanted[tuple(delete[2:])] = update
    changes = 0
    for key in sorted(present - set(wanted)):
        run(["policy", "delete", *key], netns)
        changes += 1
    for key in sorted(set(wanted) - present):
        run(wanted[key], netns)
        changes += 1
    return changes
