"""flanneld's whole kernel path (flags, daemon wiring, both stores, every backend, interface
selection, vxlan device and address set-up, the udp and wireguard devices, cleanup) runs
without pyroute2: links, addresses and routes go through the project's own rtnetlink modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import netns

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from ipaddress import ip_address, ip_network
from flannel import daemon, flags, subnet
from flannel.ops import cleanup
from flannel.backend import backend_class, supported
from flannel.kernel import device, iface
from flannel.udp import device as udp_device
from flannel.wireguard import device as wireguard_device
for argv in (["--kube-subnet-mgr", "--kube-api-url=http://127.0.0.1:1"],
             ["--etcd-endpoints=http://127.0.0.1:1"]):
    subnet.open_store(flags.parse_args(argv, {}).store)
for kind in supported():
    backend_class(kind)
ext = iface.select_external_interface(iface.read_snapshot(), iface.IfaceOptions())
spec = device.VxlanSpec("flannel.1", 1, 0, ext.iface_addr, ext.index, False, False, 1450,
                        device.vtep_mac(1, ext.iface_addr))
dev = device.ensure_vxlan(spec)
device.ensure_address(dev.index, ip_address("10.244.1.0"), ip_network("10.244.0.0/16"))
udp_device.ensure_tun(udp_device.TunSpec("flannel0", ip_address("10.244.1.0"), 1472,
                                         ip_network("10.244.0.0/16")))
assert wireguard_device.DeviceSpec
found = cleanup.Inventory()
cleanup.kernel_items(found)
print(ext.name, sorted(item.what for item in found.items))
found.close()
print(" ".join(sorted(m for m in sys.modules if "." not in m)))
"""


def test_flanneld_kernel_path_never_imports_pyroute2(ns):
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    result = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE],
                            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    first, modules = result.stdout.splitlines()[-2:]
    assert first.startswith("veth0 ") and "device flannel.1 (vxlan)" in first
    assert "10.244.1.0/32" in netns.ip("addr", "show", "dev", "flannel.1", netns=ns).stdout
    assert "10.244.0.0/16 dev flannel0 proto static" in netns.ip("route", netns=ns).stdout
    assert "pyroute2" not in modules.split()
