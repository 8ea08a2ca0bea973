"""What the ipsec labs share, on this kernel and in the vm lane: the network and its PSKs,
the ping payload that must never be seen on the underlay, and reading a node's charon over
its VICI socket (its IKE SAs, its pid, whether every pair is established)."""

from __future__ import annotations

import os
import socket
from ipaddress import IPv4Network
from typing import Any

from flannel_lab.cluster import Lab

NETWORK = IPv4Network("10.244.0.0/16")
PSK_A = "a" * 48 + "0123456789abcdef" * 3
PSK_B = "b" * 48 + "0123456789abcdef" * 3
CONFIG = {"Network": str(NETWORK), "Backend": {"Type": "ipsec", "PSK": PSK_A}}
PATTERN = "f1a77e1ddeadc0de"


def session(lab: Lab, index: int) -> Any:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    # A lab under a worker's temporary directory can be deeper than the 108 bytes an AF_UNIX
    # address holds: the socket is reached through its open directory's short /proc path.
    directory = os.open(lab.node_run_dir(index), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.connect(f"/proc/self/fd/{directory}/charon.vici")
    except OSError:
        sock.close()
        raise
    finally:
        os.close(directory)
    import vici  # the ipsec extra: imported by the tests that need it

    return vici.Session(sock)


def ike_sas(lab: Lab, index: int) -> dict[str, tuple[bytes, bytes, tuple[str, ...]]]:
    """Connection name -> (IKE SA unique id, state, its CHILD_SAs' names). Both ends of a
    pair initiate (start_action start, as Go sets it), so a connection may briefly hold a
    second IKE SA still connecting beside the established one: the established one counts."""
    out: dict[str, tuple[bytes, bytes, tuple[str, ...]]] = {}
    for sa in session(lab, index).list_sas():
        for name, ike in sa.items():
            seen = (ike["uniqueid"], ike["state"], tuple(sorted(ike["child-sas"])))
            if name not in out or out[name][1] != b"ESTABLISHED":
                out[name] = seen
    return out


def charon_pid(lab: Lab, index: int) -> int:
    text = (lab.node_run_dir(index) / "flannel" / "ipsec" / "charon.pid").read_text()
    return int(text)


def all_established(lab: Lab, indexes: list[int]) -> bool:
    for index in indexes:
        try:
            sas = ike_sas(lab, index)
        except OSError:  # a charon not (yet) answering
            return False
        if len(sas) != len(indexes) - 1 or any(s[1] != b"ESTABLISHED" for s in sas.values()):
            return False
    return True
