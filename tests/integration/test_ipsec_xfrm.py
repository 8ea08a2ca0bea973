"""The ipsec backend's kernel side against the real kernel in a namespace: the ESP probe (this
kernel has no ESP: the probe says so and leaves nothing behind), and, for kernels with ESP,
Go flannel's three XFRM policies per peer pair installed, replaced, found again for cleanup
(policies of another reqid left alone) and deleted."""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.ipsec import xfrm
from flannel.ipsec.config import Pair

pytestmark = pytest.mark.netns

PAIR = Pair(IPv4Address("192.168.1.10"), IPv4Network("10.244.3.0/24"),
            IPv4Address("192.168.1.11"), IPv4Network("10.244.7.0/24"))


def ip_xfrm(ns: str, *args: str) -> str:
    return subprocess.run(["ip", "-n", ns, "xfrm", *args], capture_output=True, text=True,
                          timeout=10, check=True).stdout


def test_the_esp_probe_says_what_the_kernel_takes_and_leaves_no_state(ns):
    # What `ip xfrm` itself gets for an AES-GCM ESP state (this machine's kernel refuses it).
    state = ["state", "add", "src", "192.0.2.7", "dst", "192.0.2.8", "proto", "esp", "spi",
             "0x1000", "mode", "tunnel", "aead", "rfc4106(gcm(aes))", "0x" + "11" * 20, "128"]
    taken = subprocess.run(["ip", "-n", ns, "xfrm", *state], capture_output=True,
                           timeout=10, check=False).returncode == 0
    ip_xfrm(ns, "state", "flush")
    assert xfrm.kernel_has_esp(ns) is taken
    assert ip_xfrm(ns, "state", "list").strip() == ""


def test_gos_policies_are_installed_found_and_deleted(ns):
    for argv in xfrm.policy_commands(PAIR, "update"):
        xfrm.run(argv, ns)
    for argv in xfrm.policy_commands(PAIR, "update"):  # again: replaced, not duplicated
        xfrm.run(argv, ns)
    listed = ip_xfrm(ns, "policy", "list")
    assert listed.count("proto esp reqid 11 mode tunnel") == 3
    assert ("src 10.244.3.0/24 dst 10.244.7.0/24 \n\tdir out priority 0 ptype main \n"
            "\ttmpl src 192.168.1.10 dst 192.168.1.11\n") in listed
    for direction in ("in", "fwd"):
        assert (f"src 10.244.7.0/24 dst 10.244.3.0/24 \n\tdir {direction} priority 0 ptype "
                "main \n\ttmpl src 192.168.1.11 dst 192.168.1.10\n") in listed
    # Another program's policy (reqid 12) beside ours.
    xfrm.run(["policy", "add", "src", "10.9.0.0/24", "dst", "10.8.0.0/24", "dir", "out",
              "tmpl", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "reqid", "12",
              "mode", "tunnel"], ns)
    found = xfrm.our_policies(ns)
    assert sorted(" ".join(argv[2:]) for argv in found) == [
        "src 10.244.3.0/24 dst 10.244.7.0/24 dir out",
        "src 10.244.7.0/24 dst 10.244.3.0/24 dir fwd",
        "src 10.244.7.0/24 dst 10.244.3.0/24 dir in",
    ]
    for argv in xfrm.policy_commands(PAIR, "delete"):
        xfrm.run(argv, ns)
    assert xfrm.our_policies(ns) == []
    assert "reqid 12" in ip_xfrm(ns, "policy", "list")


def test_sync_restores_a_policy_deleted_by_hand_and_drops_a_vanished_pairs(ns):
    other = Pair(PAIR.local_ip, PAIR.local_subnet, IPv4Address("192.168.1.12"),
                 IPv4Network("10.244.9.0/24"))
    xfrm.run(["policy", "add", "src", "10.9.0.0/24", "dst", "10.8.0.0/24", "dir", "out",
              "tmpl", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "reqid", "12",
              "mode", "tunnel"], ns)
    assert xfrm.sync_policies([PAIR, other], ns) == 6
    assert xfrm.sync_policies([PAIR, other], ns) == 0
    xfrm.run(["policy", "delete", "src", "10.244.9.0/24", "dst", "10.244.3.0/24", "dir",
              "fwd"], ns)
    assert xfrm.sync_policies([PAIR, other], ns) == 1
    assert len(xfrm.our_policies(ns)) == 6
    assert xfrm.sync_policies([PAIR], ns) == 3
    assert sorted(" ".join(a[2:6]) for a in xfrm.our_policies(ns)) == [
        "src 10.244.3.0/24 dst 10.244.7.0/24", "src 10.244.7.0/24 dst 10.244.3.0/24",
        "src 10.244.7.0/24 dst 10.244.3.0/24"]
    assert "reqid 12" in ip_xfrm(ns, "policy", "list")


def test_a_refused_command_names_itself(ns):
    with pytest.raises(xfrm.XfrmError, match=r"^ip xfrm policy delete: "):
        xfrm.run(xfrm.policy_commands(PAIR, "delete")[0], ns)
