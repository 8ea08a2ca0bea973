"""The derived VTEP MAC: stable, locally administered unicast, distinct per node and VNI."""

from ipaddress import ip_address

from flannel.kernel.device import vtep_mac


def test_stable_and_locally_administered_unicast():
    mac = vtep_mac(1, ip_address("192.168.1.10"))
    assert mac == vtep_mac(1, ip_address("192.168.1.10"))
    first = int(mac.split(":")[0], 16)
    assert first & 0x02 and not first & 0x01


def test_distinct_per_node_and_vni():
    macs = {vtep_mac(vni, ip_address(f"10.0.{i // 250}.{i % 250}"))
            for vni in (1, 2) for i in range(5000)}
    assert len(macs) == 10000
