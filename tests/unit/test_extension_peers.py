"""Extension bookkeeping: which command runs for which lease, with what environment and
stdin, and retries of failed commands on the next pass. Commands are real programs."""

import json
import sys
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from flannel.extension.peers import (
    CommandFailed,
    ExtensionConfig,
    ExtensionConfigError,
    ExtensionPeers,
    post_startup_env,
    pre_startup,
)
from flannel.lease import Lease, LeaseAttrs

# Appends one JSON line per call (argv, selected env, stdin) to the file named by $LOG.
RECORDER = ("import json, os, sys; "
            "open(os.environ['LOG'], 'a').write(json.dumps([sys.argv[1:], "
            "{k: os.environ.get(k) for k in ('SUBNET', 'PUBLIC_IP', 'IPV6SUBNET', "
            "'PUBLIC_IPV6')}, sys.stdin.read()]) + '\\n')")


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("LOG", str(log))
    monkeypatch.setenv("REC", RECORDER)

    def calls() -> list:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]
    return calls


def lease(n: int, data: str | None = '"0e:00:00:00:00:02"', v6: bool = False,
          backend: str = "extension") -> Lease:
    return Lease(IPv4Network(f"10.5.{n}.0/24"), IPv6Network(f"fd00:5:{n}::/64") if v6 else None,
                 attrs=LeaseAttrs(public_ip=IPv4Address(f"192.168.1.{n}"),
                                  public_ipv6=IPv6Address(f"fd00::{n}") if v6 else None,
                                  backend_type=backend, backend_data=data))


def cfg(**commands) -> ExtensionConfig:
    return ExtensionConfig.parse(commands)


PY = sys.executable


def test_config_names_match_case_insensitively_and_shutdown_is_ignored():
    c = ExtensionConfig.parse({"prestartupcommand": "a", "POSTSTARTUPCOMMAND": "b",
                               "SubnetAddCommand": "c", "subnetremovecommand": "d",
                               "ShutdownCommand": "e"})
    assert (c.pre_startup, c.post_startup, c.subnet_add, c.subnet_remove) == ("a", "b", "c",
                                                                              "d")
    with pytest.raises(ExtensionConfigError) as err:
        ExtensionConfig.parse({"SubnetAddCommand": ["ip", "route"]})
    assert str(err.value) == ('error decoding backend config: SubnetAddCommand must be a str, '
                              'got array ["ip", "route"]')


def test_pre_startup_output_is_published_as_a_json_string():
    assert pre_startup(cfg(PreStartupCommand="echo  <0e:00:00:00:00:01>  ")) == (
        '"\\u003c0e:00:00:00:00:01\\u003e"')
    assert pre_startup(cfg()) is None
    with pytest.raises(CommandFailed) as err:
        pre_startup(cfg(PreStartupCommand="ls /nonexistent-pre-startup"))
    assert str(err.value).startswith("extension pre-startup command failed (exit status 2): "
                                     "ls /nonexistent-pre-startup; output: ls: ")


def test_pre_startup_output_peers_would_refuse_is_not_published():
    # 40,000 NUL characters: 240,000 bytes as a JSON string, beyond a lease's 64 KiB.
    command = "head -c 40000 /dev/zero"
    with pytest.raises(CommandFailed) as err:
        pre_startup(cfg(PreStartupCommand=command))
    assert str(err.value) == (
        "extension pre-startup command printed 40000 characters: as BackendData that is more "
        "than the 64512 bytes other nodes accept in a lease, so every peer would ignore this "
        f"node; print less: {command}")


def test_post_startup_environment():
    own = lease(1, v6=True)
    assert post_startup_env(IPv4Network("10.5.0.0/16"), IPv6Network("fd00:5::/48"), own) == {
        "NETWORK": "10.5.0.0/16", "SUBNET": "10.5.1.0/24", "IPV6SUBNET": "fd00:5:1::/64",
        "PUBLIC_IP": "192.168.1.1", "PUBLIC_IPV6": "fd00::1"}


def test_add_runs_once_per_lease_with_env_and_stdin(recorder):
    peers = ExtensionPeers(cfg(SubnetAddCommand=f"{PY} -c $REC add $SUBNET"))
    status = peers.reconcile([lease(2), lease(3, v6=True), lease(4, backend="vxlan")])
    assert status.in_sync
    assert recorder() == [
        [["add", "10.5.2.0/24"], {"SUBNET": "10.5.2.0/24", "PUBLIC_IP": "192.168.1.2",
                                  "IPV6SUBNET": None, "PUBLIC_IPV6": None},
         "0e:00:00:00:00:02\n"],
        [["add", "10.5.3.0/24"], {"SUBNET": "10.5.3.0/24", "PUBLIC_IP": "192.168.1.3",
                                  "IPV6SUBNET": "fd00:5:3::/64", "PUBLIC_IPV6": "fd00::3"},
         "0e:00:00:00:00:02\n"]]
    peers.reconcile([lease(2), lease(3, v6=True)])
    assert len(recorder()) == 2
    # Changed data: the add command runs again, as Go does for a re-added lease.
    peers.reconcile([lease(2, data='"0e:00:00:00:00:09"'), lease(3, v6=True)])
    assert recorder()[-1][2] == "0e:00:00:00:00:09\n" and len(recorder()) == 3


def test_remove_runs_when_a_lease_goes(recorder):
    peers = ExtensionPeers(cfg(SubnetAddCommand=f"{PY} -c $REC add",
                               SubnetRemoveCommand=f"{PY} -c $REC remove $SUBNET"))
    peers.reconcile([lease(2), lease(3)])
    peers.reconcile([lease(3)])
    assert recorder()[-1] == [["remove", "10.5.2.0/24"],
                              {"SUBNET": "10.5.2.0/24", "PUBLIC_IP": "192.168.1.2",
                               "IPV6SUBNET": None, "PUBLIC_IPV6": None},
                              "0e:00:00:00:00:02\n"]
    assert len(recorder()) == 3


def test_failed_commands_are_retried_on_the_next_pass(tmp_path, caplog, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv("GATE", "import os, sys; ok = os.path.exists(sys.argv[1]); "
                               "print('ran' if ok else 'gate closed'); sys.exit(0 if ok else 1)")
    peers = ExtensionPeers(cfg(SubnetAddCommand=f"{PY} -c $GATE {gate} add",
                               SubnetRemoveCommand=f"{PY} -c $GATE {gate} remove"))
    status = peers.reconcile([lease(2)])
    assert status.pending_add == ["10.5.2.0-24"] and not status.in_sync
    assert "extension subnet-add (10.5.2.0-24) command failed (exit status 1)" in caplog.text
    assert "output: gate closed" in caplog.text
    gate.touch()
    assert peers.reconcile([lease(2)]).in_sync
    gate.unlink()
    assert peers.reconcile([]).pending_remove == ["10.5.2.0-24"]
    gate.touch()
    assert peers.reconcile([]).in_sync and peers.applied == {}


def test_a_lease_whose_data_is_not_a_json_string_is_skipped(recorder, caplog):
    peers = ExtensionPeers(cfg(SubnetAddCommand=f"{PY} -c $REC add"))
    deep = "[" * 5000 + "]" * 5000  # past the recursion limit: skipped like any other
    status = peers.reconcile([lease(2, data='{"VNI":1}'), lease(3, data=None),
                              lease(4, data=deep)])
    assert status.skipped == ["10.5.2.0-24", "10.5.4.0-24"] and status.in_sync
    assert ("ignoring extension lease 10.5.2.0-24: its BackendData is not a JSON string (the "
            "output of the owner's PreStartupCommand); the node that owns it rewrites it on "
            "restart, or delete the lease") in caplog.text
    assert "ignoring extension lease 10.5.4.0-24" in caplog.text
    assert [call[2] for call in recorder()] == ["\n"]
