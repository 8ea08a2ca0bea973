"""The wireguard backend without devices: selection, config and key errors as an operator sees
them, the failing-handshake judgement, and the data plane re-running an applier that asks to
be re-checked. Devices, peers and traffic are covered by tests/lab/test_wireguard_lab.py."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from ipaddress import IPv4Address

import pytest

from flannel.backend import BackendError, backend_class
from flannel.backend.base import Applier, ApplyResult
from flannel.backend.wireguard import WireguardBackend
from flannel.config import check_network_config, parse_config
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease
from flannel.wireguard.handshakes import HandshakeWatch
from flannel.wireguard.keys import KEY_FILE_ENV, generate_private_key
from flannel.wireguard.uapi import Peer, PeerState
from tests.support.clock import FakeClock
from tests.support.dataplanes import AllocWithEngine, parked, peer, programmed, running, until
from tests.support.fakenetlink import FakeKernel

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("192.168.1.1"), None)
PSK = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


def config(backend: dict[str, object], **extra: object):
    parsed = parse_config(json.dumps({"Network": "10.244.0.0/16",
                                      "Backend": {"Type": "wireguard", **backend}, **extra}))
    check_network_config(parsed)
    return parsed


def test_wireguard_is_a_backend_type():
    assert backend_class("wireguard") is WireguardBackend


@pytest.mark.parametrize(("backend", "message"), [
    ({"Mode": "both"}, 'no valid Mode configured: "both"; use one of separate, auto, ipv4, '
                       "ipv6"),
    ({"ListenPort": 0}, "error decoding backend config: ListenPort 0 is not a UDP port; use 1 "
                        "to 65535"),
    ({"PSK": "hunter2-is-not-a-key"}, "error decoding backend config: the wireguard "
                                      "backend's PSK is not a WireGuard key"),
])
def test_a_bad_config_is_refused_when_the_backend_is_created(backend, message):
    with pytest.raises(BackendError) as raised:
        WireguardBackend(EXT, config(backend))
    assert str(raised.value).startswith(message)
    assert "hunter2" not in str(raised.value)


async def test_a_key_file_others_can_write_is_refused_without_showing_the_key(
        tmp_path, monkeypatch, caplog):
    key_file = tmp_path / "wgkey"
    key = generate_private_key()
    key_file.write_text(key.base64())
    os.chmod(key_file, 0o646)  # noqa: S103 (the unsafe mode under test)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BackendError) as raised:
        await WireguardBackend(EXT, config({})).prepare()
    assert str(raised.value) == (f"WireGuard key file {key_file} has mode 0646, writable by "
                                 f"other users; run `chmod 0400 {key_file}` (and consider the "
                                 "key leaked)")
    assert key.base64() not in caplog.text


async def test_a_missing_family_address_is_refused_before_any_key_or_device(
        tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "wgkey"))
    dual = config({}, EnableIPv6=True, IPv6Network="fd00:10:244::/56")
    with pytest.raises(BackendError) as raised:
        await WireguardBackend(EXT, dual).prepare()
    assert str(raised.value) == "wireguard needs an IPv6 address on eth0 (or --public-ipv6)"
    assert os.listdir(tmp_path) == []


def state(rx: int, handshake: float | None = None) -> PeerState:
    return PeerState(Peer("k"), handshake, rx_bytes=rx)


def test_a_peer_that_sends_but_never_completes_a_handshake_is_failing_after_the_grace():
    watch = HandshakeWatch(grace=7)
    assert watch.observe({"k": state(0)}, 100) == {}  # first reading: the baseline
    assert watch.observe({"k": state(148)}, 101) == {}  # an initiation arrived
    assert watch.observe({"k": state(148)}, 107.5) == {}
    assert watch.observe({"k": state(296)}, 108) == {"k": 7}  # retried, still no session
    # A handshake completes: no longer failing, and the new baseline is taken.
    assert watch.observe({"k": state(500, handshake=109)}, 109.5) == {}
    assert watch.observe({"k": state(500)}, 400) == {}  # idle long after: not failing


def test_a_failing_peer_that_stops_sending_is_no_longer_failing_after_the_quiet_time():
    watch = HandshakeWatch(grace=7, quiet=95)
    watch.observe({"k": state(0)}, 100)
    watch.observe({"k": state(148)}, 101)
    assert watch.observe({"k": state(296)}, 150) == {"k": 49}
    assert watch.observe({"k": state(296)}, 245) == {"k": 144}  # 95 s since it last sent
    assert watch.observe({"k": state(296)}, 246) == {}  # gave up (or its PSK was fixed)
    watch.observe({"k": state(444)}, 300)  # trying again: a new episode, a new grace
    assert watch.observe({"k": state(592)}, 306) == {}
    assert watch.observe({"k": state(592)}, 307) == {"k": 7}


def test_a_silent_peer_is_never_failing_nor_a_readded_one_counted_from_old_bytes():
    watch = HandshakeWatch(grace=7)
    for now in range(100, 200, 10):
        assert watch.observe({"down": state(0)}, now) == {}
    watch.observe({"k": state(1000)}, 100)
    watch.observe({"k": state(0)}, 101)  # removed by hand and re-added: counters restart
    assert watch.observe({"k": state(0)}, 120) == {}
    watch.observe({}, 121)  # gone: forgotten
    assert watch.observe({"k": state(148)}, 122) == {}


class RecheckingApplier(Applier):
    """An engine that asks to be re-checked: counts the passes it gets."""

    name = "test engine"

    def __init__(self, recheck: float) -> None:
        self.recheck = recheck
        self.passes = 0

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        self.passes += 1
        return ApplyResult(0, "", recheck=self.recheck)


@pytest.mark.parametrize("recheck", [0.05, 0.0])
async def test_an_applier_asking_to_be_rechecked_runs_again_without_a_lease_change(recheck):
    engine = RecheckingApplier(recheck)
    clock = FakeClock()
    async with running(AllocWithEngine(engine), FakeKernel(), interval=300,
                       clock=clock) as dataplane:
        dataplane.set_peers([peer(2, "")])
        await programmed(dataplane)
        if recheck:
            for passes in range(2, 6):  # a pass every 0.05 s, not one before
                await parked(clock, 0.05)
                await clock.advance(0.049)
                assert engine.passes == passes - 1
                await clock.advance(0.001)
                await until(lambda n=passes: engine.passes == n, f"pass {passes}")
        else:
            # Without a re-check, nothing runs before the next change (interval 300 s).
            await parked(clock, 300)
            await clock.advance(299.9)
            assert engine.passes == 1
            dataplane.set_peers([peer(3, "")])
            await until(lambda: engine.passes == 2, "the pass of the change")
        assert dataplane.readiness.current() == (True, "")

