"""Extension bookkeeping: which command runs for which lease, with what environment and
stdin, and retries of failed commands on the next pass. Commands are real programs."""

import json
import logging
import sys
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from flannel.backendconf.errors import BackendConfigError
from flannel.extension.peers import (
    CommandFailed,
    ExtensionConfig,
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
    return ExtensionConfig.from_backend(commands)


PY = sys.executable


def test_config_names_match_case_insensitively_and_shutdown_is_ignored():
    c = ExtensionConfig.from_backend({"prestartupcommand": "a", "POSTSTARTUPCOMMAND": "b",
                               "SubnetAddCommand": "c", "subnetremovecommand": "d",
                               "ShutdownCommand": "e"})
    assert (c.pre_startup, c.post_startup, c.subnet_add, c.subnet_remove) == ("a", "b", "c",
                                                                              "d")
    with pytest.raises(BackendConfigError) as err:
        ExtensionConfig.from_backend({"SubnetAddCommand": ["ip", "route"]})
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


def test_a_peer_the_command_fails_for_is_skipped_and_retried_with_backoff(tmp_path, caplog,
                                                                         monkeypatch):
    gate, tries = tmp_path / "gate", tmp_path / "tries"
    # Refuses 10.5.2.0/24 while the gate is closed; every call is one line in $TRIES.
    monkeypatch.setenv("GATE", "import os, sys; open(os.environ['TRIES'], 'a').write("
                               "os.environ['SUBNET'] + '\\n'); ok = os.environ['SUBNET'] != "
                               "'10.5.2.0/24' or os.path.exists(sys.argv[1]); print('ran' if "
                               "ok else 'gate closed'); sys.exit(0 if ok else 1)")
    monkeypatch.setenv("TRIES", str(tries))
    caplog.set_level(logging.INFO, logger="flannel.extension.peers")
    now = [100.0]
    peers = ExtensionPeers(cfg(SubnetAddCommand=f"{PY} -c $GATE {gate} add",
                               SubnetRemoveCommand=f"{PY} -c $GATE {gate} remove"),
                           clock=lambda: now[0])

    def tried() -> list[str]:
        return tries.read_text().split() if tries.exists() else []

    status = peers.reconcile([lease(2), lease(3)])
    assert status.in_sync and status.bad == ["10.5.2.0-24"] and status.retry_in == 5.0
    assert list(peers.applied) == ["10.5.3.0-24"] and peers.failures == 1
    assert "extension subnet-add (10.5.2.0-24) command failed (exit status 1)" in caplog.text
    assert "output: gate closed" in caplog.text
    assert ("skipping extension lease 10.5.2.0-24: the subnet-add command fails for it, so "
            "this node cannot reach that node; the other peers are not held back. Retried in "
            "5 s, then less and less often (every 300 s at most), at once when the lease "
            "changes") in caplog.text
    assert peers.bad["10.5.2.0-24"].reason == "subnet-add command failed (exit status 1): " \
                                              "gate closed"
    now[0] += 4.9
    peers.reconcile([lease(2), lease(3)])
    assert tried() == ["10.5.2.0/24", "10.5.3.0/24"]  # not due yet: not run
    now[0] += 0.2
    assert peers.reconcile([lease(2), lease(3)]).retry_in == 10.0  # failed again: backs off
    assert tried().count("10.5.2.0/24") == 2 and peers.failures == 2
    assert caplog.text.count("skipping extension lease 10.5.2.0-24") == 1  # logged once
    # A changed lease is tried at once.
    peers.reconcile([lease(2, data='"0e:00:00:00:00:22"'), lease(3)])
    assert tried().count("10.5.2.0/24") == 3
    gate.touch()
    now[0] += 300
    status = peers.reconcile([lease(2, data='"0e:00:00:00:00:22"'), lease(3)])
    assert status.bad == [] and status.retry_in == 0 and not peers.bad
    assert "extension lease 10.5.2.0-24 is no longer refused" in caplog.text
    # The remove command failing for a peer is the same: skipped, retried later.
    gate.unlink()
    status = peers.reconcile([lease(3)])
    assert status.in_sync and status.bad == ["10.5.2.0-24"] and "10.5.2.0-24" in peers.applied
    gate.touch()
    now[0] += 5
    assert peers.reconcile([lease(3)]).bad == [] and list(peers.applied) == ["10.5.3.0-24"]


def test_a_command_that_cannot_run_is_this_nodes_failure(caplog):
    peers = ExtensionPeers(cfg(SubnetAddCommand="/nonexistent/add-peer"))
    status = peers.reconcile([lease(2), lease(3)])
    assert status.pending_add == ["10.5.2.0-24", "10.5.3.0-24"] and not status.in_sync
    assert status.bad == [] and peers.failures == 0
    assert "cannot run /nonexistent/add-peer" in caplog.text
    assert peers.reconcile([lease(2), lease(3)]).pending_add == ["10.5.2.0-24", "10.5.3.0-24"]


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
