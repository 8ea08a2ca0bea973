"""The udp backend's config checks, its lease, the peers it takes and ignores, and what it
asks the data plane to keep (no kernel involved)."""

from __future__ import annotations

import itertools
import logging
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend import backend_class
from flannel.backend.base import BackendError
from flannel.backend.udp import UdpBackend, _ForwarderApplier
from flannel.config import check_network_config, parse_config
from flannel.kernel import events, rtnl
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import LinkState, drift
from flannel.lease import Lease, LeaseAttrs
from flannel.udp.forwarder import ForwarderStatus

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("192.168.1.1"), None)


def backend(extra: str = "", backend_config: str = '{"Type":"udp"}') -> UdpBackend:
    config = parse_config(f'{{"Network":"10.244.0.0/16"{extra},"Backend":{backend_config}}}')
    check_network_config(config)
    return UdpBackend(EXT, config)


def lease(third: int, backend_type: str = "") -> Lease:
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(f"192.168.1.{third}"), backend_type=backend_type))


def test_udp_is_a_registered_backend():
    assert backend_class("udp") is UdpBackend


async def test_defaults_port_8285_and_publishes_no_backend_type_and_mtu_minus_28():
    udp = backend()
    assert udp.port == 8285
    local = await udp.prepare()
    assert (local.backend_type, local.mtu, local.backend_data) == ("", 1472, None)
    attrs = LeaseAttrs(public_ip=EXT.ext_addr, backend_type=local.backend_type,
                       backend_data=local.backend_data)
    assert attrs.to_json() == '{"PublicIP":"192.168.1.1","PublicIPv6":null}'
    assert backend(backend_config='{"Type":"udp","port":7890}').port == 7890


@pytest.mark.parametrize(("config", "message"), [
    ('{"Type":"udp","Port":"8285"}',
     "error decoding UDP backend config: Port must be an integer, got string \"8285\""),
    ('{"Type":"udp","Port":0}',
     "error decoding UDP backend config: Port 0 is not a UDP port; give 1 to 65535 (every "
     "node of the network must use the same one; default 8285)"),
    ('{"Type":"udp","Port":70000}',
     "error decoding UDP backend config: Port 70000 is not a UDP port; give 1 to 65535 "
     "(every node of the network must use the same one; default 8285)"),
])
def test_a_bad_port_is_refused_with_what_to_give(config, message):
    with pytest.raises(BackendError) as err:
        backend(backend_config=config)
    assert str(err.value) == message


async def test_ipv6_settings_are_refused_with_what_to_change():
    udp = backend(',"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"')
    with pytest.raises(BackendError) as err:
        await udp.prepare()
    assert str(err.value) == (
        "the udp backend carries IPv4 only, but the network config sets EnableIPv6: remove "
        "EnableIPv6 and IPv6Network (and keep EnableIPv4) to use udp, or choose a backend "
        "with IPv6 support (vxlan, wireguard, host-gw)")


def test_leases_of_other_backends_are_ignored_and_named_once(caplog):
    udp = backend()
    caplog.set_level(logging.WARNING)
    assert udp.wants(lease(2))
    assert not udp.wants(lease(3, "vxlan"))
    assert not udp.wants(lease(3, "vxlan"))
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring lease 10.244.3.0-24 (public IP 192.168.1.3): its node runs the vxlan "
        "backend, which this node's udp backend cannot reach; every node of a network must "
        "run the same backend"]


def test_the_data_plane_keeps_the_tun_its_address_and_the_network_route():
    udp = backend()
    udp.lease = lease(1)
    udp.tun_index = 9
    state = udp.desired_state([lease(2)], lambda _ip: None)
    assert state.routes == {rtnl.Route("10.244.0.0/16", None, 9)}
    assert state.links == {LinkState(9, "flannel0", 1472, "", carrier=True)}
    assert state.addresses == {(9, "10.244.1.0/32")}
    # A forwarder that exits takes the TUN's carrier with it: drift, so a pass restarts it.
    assert drift(state, events.KernelEvent(False, rtnl.Link(9, "flannel0", True, 1472,
                                                             carrier=False))) == \
        "device flannel0 lost its carrier"
    assert drift(state, events.KernelEvent(False, rtnl.Link(9, "flannel0", True, 1472))) == ""
    assert drift(state, events.KernelEvent(True, rtnl.Route("10.244.0.0/16", None, 9),
                                           rtnl.RTPROT_FLANNEL)) == "route 10.244.0.0/16 deleted"


def test_the_forwarder_applier_reports_a_stopped_forwarder():
    udp = backend()
    udp.lease = lease(1)
    [applier] = udp.appliers()
    assert applier.name == "udp forwarder"
    assert applier.apply([lease(2)]).error == "stopped (flanneld is shutting down)"


class DyingForwarder:
    """Stands in for ``UdpForwarder`` (a real one needs root and a TUN; the integration
    tests cover it): reports itself dead until ``start``, and counts the starts."""

    pid = 4242

    def __init__(self) -> None:
        self.alive, self.starts = False, 0

    def status(self) -> ForwarderStatus:
        if self.alive:
            return ForwarderStatus(True, self.pid, tun_attached=True)
        return ForwarderStatus(False, None, last_error="udp forwarder exited with code 1")

    def start(self) -> None:
        self.alive, self.starts = True, self.starts + 1

    def set_peers(self, peers) -> None:
        pass


def test_a_forwarder_that_keeps_dying_is_restarted_with_a_growing_delay():
    udp = backend()
    udp.lease = lease(1)
    forwarder = DyingForwarder()
    udp.forwarder = forwarder  # type: ignore[assignment]
    now = [100.0]
    applier = _ForwarderApplier(udp, clock=lambda: now[0])
    starts_at = []
    for _ in range(4000):  # 10 ms between passes for 40 s: the forwarder dies every pass
        result = applier.apply([lease(2)])
        if forwarder.alive:
            starts_at.append(now[0])
            forwarder.alive = False
        else:
            assert "restarting it in" in result.error and result.recheck > 0
        now[0] += 0.01
    gaps = [b - a for a, b in itertools.pairwise(starts_at)]
    assert len(starts_at) == 10, starts_at  # 0.1, 0.2, 0.4 ... 6.4, 10, 10 s apart: not 4000
    assert gaps == sorted(gaps) and gaps[-1] == pytest.approx(10.0, abs=0.02)
    # A forwarder that then runs for a while is restarted at once after its next death.
    forwarder.start()
    applier.apply([lease(2)])
    now[0] += 60
    forwarder.alive = False
    applier.apply([lease(2)])
    assert forwarder.alive
