"""The host handle: where flanneld acts, and what it refuses before touching anything."""

from __future__ import annotations

import pytest

from flannel.kernel.host import LOCAL, Host


def test_local_runs_tools_as_given() -> None:
    assert LOCAL.command(["iptables-save", "-t", "nat"]) == ["iptables-save", "-t", "nat"]
    assert str(LOCAL) == "this host"


def test_a_named_namespace_prefixes_tools_with_ip_netns_exec() -> None:
    node = Host("node-1")
    assert node.command(["nft", "-f", "-"]) == ["ip", "netns", "exec", "node-1", "nft", "-f", "-"]
    assert str(node) == "network namespace node-1"


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "-x", "a" * 65, "node 1"])
def test_a_namespace_name_that_is_no_path_component_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid network namespace name"):
        Host(name)


@pytest.mark.parametrize("key", ["../../etc/passwd", "net//ipv4", "net/./x", ""])
def test_a_sysctl_key_cannot_leave_proc_sys(key: str) -> None:
    with pytest.raises(ValueError, match="invalid sysctl key"):
        LOCAL.read_sysctl(key)


def test_reads_a_sysctl_of_the_namespace_it_runs_in() -> None:
    assert LOCAL.read_sysctl("net/ipv4/ip_forward") in ("0", "1")
