"""S2 (reachability between every pair) and S10 (exact data-plane state) in a 3-node lab,
for vxlan and host-gw, IPv4 and dual-stack."""

from __future__ import annotations

import json

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import in_ns, ip

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

IPV6 = {"EnableIPv6": True, "IPv6Network": "fd00:10:244::/56"}


def config(backend: str, dual: bool) -> dict:
    base = {"Network": "10.244.0.0/16", "Backend": {"Type": backend}}
    return {**base, **IPV6} if dual else base


def leases_by_ip(lab) -> dict[str, dict]:
    out = {}
    for key, value in lab.leases().items():
        doc = json.loads(value)
        out[doc["PublicIP"]] = {"key": key, **doc}
    return out


def routes(lab, index: int, family: str = "-4") -> list[dict]:
    return json.loads(ip(lab.node_ns(index), "-j", family, "route", "show", "proto", "151")
                      .stdout or "[]")


@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
@pytest.mark.parametrize("backend", ["vxlan", "host-gw"])
def test_every_pair_reaches_each_other_with_exact_state(make_lab, backend, dual):
    lab = make_lab()
    nodes = build(lab, 3, config(backend, dual))
    wait_for_mesh(lab, nodes, ipv6=dual, timeout=20)
    for src in nodes:
        for dst in nodes:
            if src != dst:
                assert lab.ping(src, dst), f"IPv4 {src}->{dst}"
                if dual:
                    assert lab.ping(src, dst, v6=True), f"IPv6 {src}->{dst}"

    want_mtu = {"host-gw": "1500", "vxlan": "1430" if dual else "1450"}[backend]
    assert all(lab.wait_subnet_env(i)["FLANNEL_MTU"] == want_mtu for i in nodes)
    leases = leases_by_ip(lab)
    assert len(leases) == 3
    for index in nodes:
        node = lab.node(index)
        peers = [lease for addr, lease in leases.items() if addr != node.address]
        for family in ("-4", "-6") if dual else ("-4",):
            got = routes(lab, index, family)
            assert len(got) == 2, got  # one route per peer, nothing else of ours
            for route in got:
                peer = next(p for p in peers
                            if route["dst"] == _subnet(p["key"], family))
                if backend == "host-gw":
                    want_gw = peer["PublicIP"] if family == "-4" else peer["PublicIPv6"]
                    assert (route["gateway"], route["dev"]) == (want_gw, "eth0")
                else:
                    assert route["gateway"] == route["dst"].split("/")[0]
                    assert "onlink" in route["flags"]
                    assert route["dev"] == ("flannel.1" if family == "-4" else "flannel-v6.1")
        if backend == "vxlan":
            check_vxlan_state(lab, index, peers, dual)


def _subnet(key: str, family: str) -> str:
    v4, _, v6 = key.partition("&")
    text = v4 if family == "-4" else v6
    addr, _, plen = text.rpartition("-")
    return f"{addr}/{plen}"


def check_vxlan_state(lab, index: int, peers: list[dict], dual: bool) -> None:
    ns = lab.node_ns(index)
    links = {link["ifname"]: link for link in json.loads(ip(ns, "-j", "-d", "link").stdout)}
    for name, data_key, pub_key, family in (("flannel.1", "BackendData", "PublicIP", "-4"),
                                            ("flannel-v6.1", "BackendV6Data", "PublicIPv6",
                                             "-6")):
        if family == "-6" and not dual:
            assert name not in links
            continue
        link = links[name]
        info = link["linkinfo"]["info_data"]
        mtu = 1450 if family == "-4" else 1430
        assert (info["id"], info["port"], info["learning"], link["mtu"]) == (1, 8472, False,
                                                                             mtu)
        neighbours = json.loads(ip(ns, "-j", family, "neigh", "show", "dev", name).stdout)
        permanent = {(n["dst"], n["lladdr"]) for n in neighbours if "PERMANENT" in n["state"]}
        want = {(_subnet(p["key"], family).split("/")[0], p[data_key]["VtepMAC"])
                for p in peers}
        assert permanent == want
        fdb = json.loads(in_ns(ns, "bridge", "-j", "fdb", "show", "dev", name).stdout)
        entries = {(f["mac"], f["dst"]) for f in fdb if "dst" in f and "permanent" in
                   f.get("state", "")}
        assert entries == {(p[data_key]["VtepMAC"], p[pub_key]) for p in peers}
