"""The iptables backend (legacy or nft) is chosen to match the host: kubelet/kube-proxy
chains decide, then the number of rules, then nft; ``--iptables-mode`` overrides, and every
rule flanneld writes lands in the chosen backend (read back with that backend's -save)."""

from __future__ import annotations

import json
import shutil
import subprocess
from ipaddress import ip_network

import pytest

from flannel.flags import UsageError, parse_args
from flannel.kernel.host import Host
from flannel.rules.iptables import LEGACY, NFT, RulesError, Variant
from flannel.rules.manager import TrafficManager
from flannel.rules.mode import BackendScan, choose_variant, decide, scan
from flannel.rules.spec import FamilyRules
from flannel_lab.etcd import EtcdServer
from tests.support import netns
from tests.support.flanneld import Flanneld
from tests.support.waiting import wait_until

V4 = FamilyRules(4, ip_network("10.42.0.0/16"), ip_network("10.42.0.0/24"), True, True)
PREFIX = "/coreos.com/network"


def run(ns: str, *cmd: str) -> str:
    result = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, f"{cmd}: {result.stderr}"
    return result.stdout


def kube_chain(ns: str, variant: Variant, chain: str = "KUBE-FORWARD",
               table: str = "filter") -> None:
    run(ns, variant.command(4), "-t", table, "-N", chain)


def saved(ns: str, variant: Variant) -> str:
    return run(ns, variant.command(4, "save"))


def test_kube_chain_in_legacy_only_chooses_legacy(ns):
    kube_chain(ns, LEGACY)
    variant, why = choose_variant("auto", Host(ns))
    assert variant == LEGACY
    assert why == ("kubelet/kube-proxy chains (KUBE-FORWARD) are in legacy only, none in nft")


def test_kube_chain_in_nft_only_chooses_nft_even_when_legacy_has_more_rules(ns):
    kube_chain(ns, NFT, "KUBE-IPTABLES-HINT", "mangle")
    for port in range(3):
        run(ns, "iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", str(8000 + port),
            "-j", "ACCEPT")
    variant, why = choose_variant("auto", Host(ns))
    assert variant == NFT
    assert "KUBE-IPTABLES-HINT" in why and "nft only" in why


def test_without_kube_chains_more_rules_wins_and_an_empty_host_gets_nft(ns):
    variant, why = choose_variant("auto", Host(ns))
    assert (variant, why) == (NFT, "no KUBE-* chains; legacy and nft hold 0 rule(s) each; "
                                   "nft is the default")
    run(ns, "iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
    assert choose_variant("auto", Host(ns)) == (
        LEGACY, "no KUBE-* chains; legacy holds more rules (legacy 1, nft 0)")


def test_our_own_rules_do_not_count(ns):
    """Rules flanneld left in one backend must not pull the choice towards it."""
    traffic = TrafficManager([V4], False, host=Host(ns), iptables_mode="legacy")
    traffic.prepare()
    traffic.ensure()
    assert "FLANNEL-POSTRTG" in saved(ns, LEGACY)
    assert scan(LEGACY, Host(ns)).rules == 0
    assert choose_variant("auto", Host(ns))[0] == NFT


def test_both_with_kube_chains_prefers_kubelets_marker():
    legacy = BackendScan(LEGACY, ("KUBE-FORWARD", "KUBE-SERVICES"), 40)
    nft = BackendScan(NFT, ("KUBE-KUBELET-CANARY",), 3)
    assert decide(legacy, nft) == (NFT, "both hold KUBE-* chains; kubelet's marker chain is "
                                        "in nft")


def test_override_wins_over_detection(ns):
    kube_chain(ns, LEGACY)
    assert choose_variant("nft", Host(ns)) == (NFT, "--iptables-mode=nft")


def test_rules_land_in_the_chosen_backend_and_leave_the_other(ns):
    kube_chain(ns, LEGACY)
    stale = TrafficManager([V4], False, host=Host(ns), iptables_mode="nft")
    stale.prepare()
    stale.ensure()
    assert "FLANNEL-FWD" in saved(ns, NFT)

    traffic = TrafficManager([V4], False, host=Host(ns))
    traffic.prepare()
    assert traffic.rules.variant == LEGACY
    assert traffic.ensure() is True
    legacy = saved(ns, LEGACY)
    assert ":FLANNEL-POSTRTG" in legacy and ":FLANNEL-FWD" in legacy
    assert "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD" in legacy
    assert "FLANNEL" not in saved(ns, NFT)  # the copy in the other backend was removed
    assert traffic.ensure() is False


def test_with_one_backend_installed_it_is_used_and_forcing_the_other_says_what_is_missing(
        tmp_path, monkeypatch):
    only_nft = tmp_path / "bin"
    only_nft.mkdir()
    for version in (4, 6):
        for tool in ("", "save", "restore"):
            name = NFT.command(version, tool)
            (only_nft / name).symlink_to(shutil.which(name))
    monkeypatch.setenv("PATH", str(only_nft))
    assert choose_variant("auto") == (NFT, "only iptables-nft is installed")
    with pytest.raises(RulesError) as refused:
        choose_variant("legacy")
    assert str(refused.value) == ("--iptables-mode=legacy: iptables-legacy (with -save and "
                                  "-restore) not found in PATH; install it or use "
                                  "--iptables-mode=auto")


@pytest.mark.parametrize("value", ["iptables", "LEGACY", "nftables"])
def test_bad_mode_is_refused_naming_the_flag(value):
    with pytest.raises(UsageError) as refused:
        parse_args([f"--iptables-mode={value}"], {})
    assert str(refused.value) == f"--iptables-mode={value}: not one of auto, legacy, nft"
    with pytest.raises(UsageError, match="--iptables-mode"):
        parse_args([], {"FLANNELD_IPTABLES_MODE": value})


@pytest.fixture
def node(ns, tmp_path):
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        server.ctl("put", f"{PREFIX}/config", json.dumps(
            {"Network": "10.5.0.0/16", "Backend": {"Type": "alloc"}}))
        yield ns, server


@pytest.mark.parametrize(("env", "expected", "why"), [
    ({}, LEGACY, "kubelet/kube-proxy chains (KUBE-FORWARD) are in legacy only, none in nft"),
    ({"FLANNELD_IPTABLES_MODE": "nft"}, NFT, "--iptables-mode=nft"),
])
def test_flanneld_logs_its_choice_and_writes_there(node, tmp_path, monkeypatch, env,
                                                   expected, why):
    ns, server = node
    kube_chain(ns, LEGACY)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    daemon = Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}", "--ip-masq",
                                 f"--subnet-file={tmp_path / 'subnet.env'}"], netns=ns).start()
    try:
        daemon.wait_log(f"Using {expected.label} for the traffic rules: {why}")
        wait_until(lambda: ":FLANNEL-POSTRTG" in saved(ns, expected), 15,
                   what=f"rules in {expected.label}")
        other = NFT if expected == LEGACY else LEGACY
        assert "FLANNEL" not in saved(ns, other)
    finally:
        daemon.stop()
