"""The extension backend on the data plane contract, with real commands (python, ip) run by
the real data plane: what a node publishes, the post-startup command and the subnet
commands it runs for peers that come, change and go, failures reported in readiness and
retried with backoff until they succeed, never fatal; commands run in the Host's namespace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from flannel.backend.base import BackendError, BackendOptions
from flannel.backend.extension import ExtensionBackend
from flannel.config import check_network_config, parse_config
from flannel.dataplane.loop import COMPONENT, NOT_PROGRAMMED, Dataplane
from flannel.kernel.host import Host
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.readiness import Readiness
from tests.support.waiting import async_wait_until

PY = sys.executable
# The public address differs from the interface's: extension publishes the interface's.
EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("203.0.113.1"), None)
OWN = Lease(IPv4Network("10.244.1.0/24"), attrs=LeaseAttrs(public_ip=IPv4Address(
    "192.168.1.1"), backend_type="extension"))
# Appends one JSON line per call (argv, selected env, stdin) to $LOG; exits 1 while the file
# named by $GATE does not exist.
RECORDER = ("import json, os, sys; "
            "open(os.environ['LOG'], 'a').write(json.dumps([sys.argv[1:], "
            "{k: os.environ.get(k) for k in ('NETWORK', 'SUBNET', 'PUBLIC_IP')}, "
            "'' if sys.argv[1] == 'post' else sys.stdin.read()]) + '\\n'); "
            "sys.exit(0 if os.path.exists(os.environ['GATE']) else 1)")


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[list[object]]]:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("LOG", str(log))
    monkeypatch.setenv("GATE", str(tmp_path / "gate"))
    monkeypatch.setenv("REC", RECORDER)
    (tmp_path / "gate").touch()

    def read() -> list[list[object]]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]
    return read


def backend(host: Host | None = None, **commands: str | int) -> ExtensionBackend:
    config = parse_config(json.dumps({"Network": "10.244.0.0/16",
                                      "Backend": {"Type": "extension", **commands}}))
    check_network_config(config)
    return ExtensionBackend(EXT, config, BackendOptions(host) if host else None)


def peer(third: int, mac: str = "0e:00:00:00:00:02") -> Lease:
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(f"192.168.1.{third}"), backend_type="extension",
        backend_data=json.dumps(mac)))


async def no_kernel_events(_on_event: object, _on_overrun: object) -> None:
    await asyncio.Event().wait()


def no_netlink() -> object:
    raise AssertionError("the extension backend must not open a netlink socket")


@contextlib.asynccontextmanager
async def running(ext: ExtensionBackend) -> AsyncIterator[Dataplane]:
    dataplane = Dataplane(ext, Readiness([COMPONENT]), netlink=no_netlink,  # type: ignore[arg-type]
                          watch=no_kernel_events, retry=(0.05, 0.2))
    task = asyncio.create_task(dataplane.run())
    try:
        yield dataplane
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(condition: Callable[[], object], what: str) -> None:
    async def check() -> object:
        return condition()
    await async_wait_until(check, 15.0, interval=0.01, what=what)


async def test_pre_startup_output_is_the_backend_data_and_the_interface_ip_is_published():
    ext = backend(PreStartupCommand="echo 0e:00:00:00:00:01")
    local = await ext.prepare()
    assert (local.backend_type, local.mtu, local.backend_data) == (
        "extension", 1500, '"0e:00:00:00:00:01"')
    assert (local.public_ip, local.public_ipv6) == (IPv4Address("192.168.1.1"), None)
    assert (await backend().prepare()).backend_data is None


async def test_a_failing_pre_startup_command_stops_the_start_with_its_output():
    with pytest.raises(BackendError) as err:
        await backend(PreStartupCommand="ls /nonexistent-pre-startup").prepare()
    message = str(err.value)
    assert message.startswith("extension pre-startup command failed (exit status 2): ls "
                              "/nonexistent-pre-startup; output: ls: ")
    assert message.endswith("; fix the command (it runs without a shell: write a script for "
                            "pipes, redirections or several steps)")


async def test_pods_get_the_external_mtu_less_the_encapsulation_overhead():
    """EncapOverhead (pyflannel's): the bytes the commands' data path adds; without it pods
    get the external MTU, as in Go."""
    assert (await backend(EncapOverhead=50).prepare()).mtu == 1450
    assert (await backend(encapoverhead=0).prepare()).mtu == 1500


@pytest.mark.parametrize(("network", "ext_mtu", "overhead", "least"), [
    ({}, 1000, 950, "a link needs at least 68"),
    ({"IPv6Network": "fd00:10:244::/56", "EnableIPv6": True}, 1300, 50,
     "IPv6 needs at least 1280"),
])
async def test_an_overhead_that_leaves_too_small_an_mtu_is_refused_before_any_command(
        tmp_path, network, ext_mtu, overhead, least):
    ran = tmp_path / "ran"
    ext = ExternalInterface("eth0", 2, ext_mtu, IPv4Address("192.168.1.1"), None,
                            IPv4Address("192.168.1.1"), None)
    config = parse_config(json.dumps({"Network": "10.244.0.0/16", **network, "Backend": {
        "Type": "extension", "PreStartupCommand": f"touch {ran}",
        "EncapOverhead": overhead}}))
    with pytest.raises(BackendError) as err:
        await ExtensionBackend(ext, config).prepare()
    assert str(err.value) == (
        f"the extension backend's EncapOverhead ({overhead}) leaves pods an MTU of "
        f"{ext_mtu - overhead} on eth0 (MTU {ext_mtu}); {least}: give the bytes the commands' "
        "data path really adds")
    assert not ran.exists()


@pytest.mark.parametrize(("value", "message"), [
    (-1, "EncapOverhead -1 is out of range; give the bytes your commands' data path adds to "
         "each pod packet (0 to 1024; 50 for vxlan over IPv4), or leave it out for none"),
    (1025, "EncapOverhead 1025 is out of range; give the bytes your commands' data path adds "
           "to each pod packet (0 to 1024; 50 for vxlan over IPv4), or leave it out for none"),
    ("50", 'EncapOverhead must be an integer, got string "50"'),
])
def test_an_overhead_out_of_range_or_of_the_wrong_type_is_refused(value, message):
    with pytest.raises(BackendError) as err:
        backend(EncapOverhead=value)
    assert str(err.value) == f"error decoding backend config: {message}"


def test_a_config_of_the_wrong_shape_is_refused():
    with pytest.raises(BackendError) as err:
        backend(SubnetAddCommand=7)  # type: ignore[arg-type]
    assert str(err.value) == ("error decoding backend config: SubnetAddCommand must be a str, "
                              "got number 7")


async def test_subnet_commands_follow_the_peers_through_the_data_plane(calls):
    ext = backend(PostStartupCommand=f"{PY} -c $REC post $SUBNET",
                  SubnetAddCommand=f"{PY} -c $REC add",
                  SubnetRemoveCommand=f"{PY} -c $REC remove")
    await ext.activate(OWN)
    assert calls() == [[["post", "10.244.1.0/24"], {
        "NETWORK": "10.244.0.0/16", "SUBNET": "10.244.1.0/24", "PUBLIC_IP": "192.168.1.1"},
        ""]]
    async with running(ext) as dataplane:
        dataplane.set_peers([peer(2), peer(3, "0e:00:00:00:00:03")])
        await until(lambda: dataplane.status.in_sync, "both peers added")
        assert calls()[1:] == [
            [["add"], {"NETWORK": None, "SUBNET": "10.244.2.0/24",
                       "PUBLIC_IP": "192.168.1.2"}, "0e:00:00:00:00:02\n"],
            [["add"], {"NETWORK": None, "SUBNET": "10.244.3.0/24",
                       "PUBLIC_IP": "192.168.1.3"}, "0e:00:00:00:00:03\n"]]
        assert dataplane.status.applied["extension commands"] == 2
        dataplane.set_peers([peer(3, "0e:00:00:00:00:03")])
        await until(lambda: dataplane.status.in_sync and len(calls()) == 4, "peer 2 removed")
        assert calls()[-1] == [["remove"], {"NETWORK": None, "SUBNET": "10.244.2.0/24",
                                            "PUBLIC_IP": "192.168.1.2"}, "0e:00:00:00:00:02\n"]


async def test_peers_the_subnet_command_fails_for_are_skipped_not_a_readiness_failure(
        calls, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("flannel.reporting.skips.PARKED_BACKOFF", (0.2, 0.4))
    ext = backend(SubnetAddCommand=f"{PY} -c $REC add $SUBNET")
    (engine,) = ext.appliers()
    (tmp_path / "gate").unlink()
    async with running(ext) as dataplane:
        dataplane.set_peers([peer(2), peer(3)])
        await until(lambda: len(calls()) >= 6, "three attempts per peer, backing off")
        assert dataplane.readiness.current() == (True, "")
        assert engine.refused_peers() == {
            "10.244.2.0-24": "subnet-add command failed (exit status 1): no output",
            "10.244.3.0-24": "subnet-add command failed (exit status 1): no output"}
        samples = {s.name: s.value for s in engine.samples()}
        assert samples["extension_bad_peers"] == 2
        assert samples["extension_peer_command_failures_total"] >= 4
        assert ("extension subnet-add (10.244.2.0-24) command failed (exit status 1): "
                f"{PY} -c $REC add $SUBNET; output: (no output)") in caplog.text
        (tmp_path / "gate").touch()
        await until(lambda: engine.refused_peers() == {}, "both added once the command works")
        attempts = len(calls())
        dataplane.trigger("a periodic pass")
        await until(lambda: dataplane.status.passes > 0 and dataplane.status.in_sync,
                    "in sync")
        assert len(calls()) == attempts  # nothing owed: nothing runs again


async def test_a_subnet_command_that_cannot_run_keeps_the_node_not_ready():
    ext = backend(SubnetAddCommand="/nonexistent/add-peer")
    async with running(ext) as dataplane:
        dataplane.set_peers([peer(2)])
        await until(lambda: "cannot" in dataplane.readiness.current()[1] or
                    "failed" in dataplane.readiness.current()[1], "not ready")
        assert dataplane.readiness.current() == (False, NOT_PROGRAMMED + (
            "extension commands: subnet-add command failed for 10.244.2.0-24 (output in the "
            "log); retrying"))


async def test_subnet_commands_wait_for_a_failed_post_startup_command(calls, tmp_path):
    ext = backend(PostStartupCommand=f"{PY} -c $REC post",
                  SubnetAddCommand=f"{PY} -c $REC add")
    (tmp_path / "gate").unlink()
    await ext.activate(OWN)
    async with running(ext) as dataplane:
        dataplane.set_peers([peer(2)])
        await until(lambda: len(calls()) >= 3, "post-startup retried")
        assert {call[0][0] for call in calls()} == {"post"}  # type: ignore[index]
        assert dataplane.readiness.current() == (False, NOT_PROGRAMMED + (
            "extension commands: the post-startup command failed (its output is in the log); "
            "subnet commands wait until it succeeds"))
        (tmp_path / "gate").touch()
        await until(lambda: dataplane.readiness.current()[0], "ready")
        assert [call[0][0] for call in calls()][-2:] == ["post", "add"]  # type: ignore[index]

