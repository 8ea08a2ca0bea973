"""Checks of the ipsec backend on this node: charon and the vici package installed, charon
answering while flanneld runs, and an established IKE SA with every peer.

Connections are recognised by Go's names (``<ourPublicIP>-<ourSubnet>-<peerSubnet>-<peerIP>``);
charon is asked over the VICI socket flanneld uses: ``/var/run/charon.vici`` as flanneld's
mount namespace has it (through ``/proc/<flanneld>/root``: a lab node's flanneld has a /run of
its own, which ``ip netns exec`` does not show).
Must not touch: charon's state (only ``list-sas`` is asked).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from flannel.ipsec.charon import VICI_SOCKET, Charon, CharonError, CharonSpec, find_charon
from flannel.ipsec.config import Pair, connection_name, established
from flannel.ops.checks import Context
from flannel.ops.findings import Finding


def check_ipsec(ctx: Context) -> list[Finding]:
    if ctx.config is None or ctx.config.backend_type != "ipsec":
        return []
    found = []
    try:
        find_charon()
    except CharonError as err:
        found.append(Finding("ipsec", "error", "strongSwan's charon is not installed",
                             str(err).split("; ", 1)[-1]))
    if importlib.util.find_spec("vici") is None:
        found.append(Finding("ipsec", "error", "the vici Python package is not installed",
                             "install pyflannel with its ipsec extra (pip install "
                             "'pyflannel[ipsec]')"))
    if found or not ctx.flanneld_pids:
        return found
    # /var/run is a link to /run, which would resolve in our own root, not flanneld's.
    root = Path(f"/proc/{ctx.flanneld_pids[0]}/root")
    charon = Charon(CharonSpec(libipsec=False, socket_path=root / "run" / VICI_SOCKET.name))
    try:
        with charon.session() as vici:
            sas = list(vici.list_sas())
    except CharonError as err:
        return [Finding("ipsec", "error", str(err),
                        "flanneld starts charon and restarts it when it dies: read "
                        "/run/flannel/ipsec/charon.log and flanneld's log for why it does "
                        "not answer")]
    own, public = ctx.own_subnet, ctx.public_ip()
    if own is None or public is None:
        return found  # without our lease no connection can be named (the node check says so)
    names = {connection_name(Pair(public, own, peer.attrs.public_ip, peer.subnet)): peer
             for peer in ctx.peers
             if peer.attrs.public_ip is not None and peer.subnet is not None}
    up = established(sas, names)
    for name, peer in names.items():
        if name not in up:
            found.append(Finding(
                "ipsec", "warning",
                f"no established IKE SA with peer {peer.attrs.public_ip} (subnet "
                f"{peer.subnet})",
                "see `swanctl --list-sas` and /run/flannel/ipsec/charon.log on both nodes: "
                "AUTHENTICATION_FAILED means another PSK, no reply means UDP 500/4500 is "
                "blocked between them"))
    return found
