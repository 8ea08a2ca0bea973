"""Pods' MTU fits the path, for every backend the lab runs and every family it carries.

flanneld writes the pods' MTU in subnet.env (``FLANNEL_MTU``) and the CNI plugin gives it to
every pod. In a two-node lab of each backend, built as ``flannel-lab up`` builds it with one
pod per node, from the pod on node 1 to the pod on node 2, in each family:

- the path carries that MTU: a don't-fragment ping of MTU bytes (ICMP payload MTU - 28,
  IPv6 MTU - 48) is answered;
- one byte more does not leave the pod: the pod refuses it itself (message too long), naming
  the MTU;
- and the MTU is not needlessly small: with both pods' links (and their bridges) one byte
  larger, the path refuses a packet of MTU + 1 bytes and names the MTU (fragmentation
  needed, packet too big). Pods have one MTU for both families, so in a dual-stack lab it is
  the tighter family's path that refuses it.

ipip runs where the kernel has the module. vxlan with DirectRouting skips the last check:
its peers on the same subnet get a plain route that carries the underlay's MTU, while pods
keep vxlan's, which every peer behind a router needs.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from flannel.ipsec import charon
from flannel_lab.cluster import Lab, Pod, ip
from tests.support.checkout import FLANNEL_LAB
from tests.support.kernelpaths import missing_ipip
from tests.support.traffic import DfPing, df_ping

pytestmark = [pytest.mark.netns, pytest.mark.etcd]


needs_wireguard = pytest.mark.skipif(
    shutil.which("wg") is None or (shutil.which("wireguard-go") is None
                                   and not Path("/sys/module/wireguard").exists()),
    reason="needs wg, and kernel WireGuard or wireguard-go")
needs_charon = pytest.mark.skipif(
    not any(shutil.which(p) for p in charon.SEARCH) or importlib.util.find_spec("vici") is None,
    reason="needs strongSwan's charon and the vici package (the ipsec extra)")
needs_moto = pytest.mark.skipif(importlib.util.find_spec("moto") is None,
                                reason="needs moto[server] (the lab's EC2)")


def lab_case(backend: str, *options: str, marks: tuple[pytest.MarkDecorator, ...] = ()
             ) -> object:
    family = "dual-stack" if "--ipv6" in options else "ipv4"
    name = backend + ("-direct-routing" if "--direct-routing" in options else "")
    return pytest.param(backend, options, id=f"{name}-{family}", marks=marks)


LABS = [
    lab_case("vxlan"), lab_case("vxlan", "--ipv6"),
    lab_case("vxlan", "--direct-routing"), lab_case("vxlan", "--direct-routing", "--ipv6"),
    lab_case("host-gw"), lab_case("host-gw", "--ipv6"),
    lab_case("udp"),
    lab_case("wireguard", marks=(needs_wireguard,)),
    lab_case("wireguard", "--ipv6", marks=(needs_wireguard,)),
    lab_case("ipsec", marks=(needs_charon,)),
    lab_case("ipip"), lab_case("extension"),
    lab_case("aws-vpc", marks=(needs_moto,)), lab_case("gce"), lab_case("ali-vpc"),
]


def lab_up(lab: Lab, backend: str, options: tuple[str, ...]) -> Lab:
    """The lab ``flannel-lab up`` builds: two nodes, a pod on each; read back from its
    state (the make_lab fixture removes it)."""
    up = subprocess.run([*FLANNEL_LAB, "--root", str(lab.directory.parent), "up", "--name",
                         lab.name, "--backend", backend, "--nodes", "2", "--pods-per-node",
                         "1", *options], capture_output=True, text=True, timeout=170,
                        check=False)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    return Lab(lab.name, root=lab.directory.parent)


def pod_link(pod: Pod) -> dict:
    """The pod's eth0 as ``ip -j link`` shows it."""
    return json.loads(ip(pod.netns, "-j", "link", "show", "eth0").stdout)[0]


def set_link_mtu(lab: Lab, pod: Pod, mtu: int) -> None:
    """The pod's eth0, its veth peer on the node and the node's bridge, all at ``mtu``."""
    link = pod_link(pod)
    node_ns = lab.node_ns(pod.node)
    peer = next(other["ifname"] for other in json.loads(ip(node_ns, "-j", "link", "show").stdout)
                if other["ifindex"] == link["link_index"])
    ip(pod.netns, "link", "set", "eth0", "mtu", str(mtu))
    ip(node_ns, "link", "set", peer, "mtu", str(mtu))
    ip(node_ns, "link", "set", "cni0", "mtu", str(mtu))


@pytest.mark.parametrize(("backend", "options"), LABS)
def test_pods_mtu_is_what_the_path_carries(make_lab, backend, options):
    if backend == "ipip" and (reason := missing_ipip()):
        pytest.skip(reason)
    lab = lab_up(make_lab(), backend, options)
    mtu = int(lab.wait_subnet_env(1)["FLANNEL_MTU"])
    assert int(lab.wait_subnet_env(2)["FLANNEL_MTU"]) == mtu
    source = next(p for p in lab.state.pods if p.node == 1)
    target = next(p for p in lab.state.pods if p.node == 2)
    assert pod_link(source)["mtu"] == mtu, "the CNI plugin gave the pod another MTU"
    addresses = {"IPv4": target.address}
    if "--ipv6" in options:
        addresses["IPv6"] = target.address6
    for family, address in addresses.items():
        carried = df_ping(source.netns, address, mtu, within=10)
        assert carried.replied, f"{family}: {mtu} bytes do not reach the other pod:\n" \
                                f"{carried.output}"
        more = df_ping(source.netns, address, mtu + 1)
        assert (more.replied, more.local, more.mtu) == (False, True, mtu), \
            f"{family}: {mtu + 1} bytes:\n{more.output}"
    if "--direct-routing" in options:
        return
    for pod in (source, target):
        set_link_mtu(lab, pod, mtu + 1)
    beyond: dict[str, DfPing] = {family: df_ping(source.netns, address, mtu + 1, count=3)
                                 for family, address in addresses.items()}
    refused = [family for family, ping in beyond.items()
               if not ping.replied and ping.mtu == mtu]
    assert refused, "the path carries more than the pods' MTU in every family:\n" + "\n".join(
        f"{family}: {ping.output}" for family, ping in beyond.items())
