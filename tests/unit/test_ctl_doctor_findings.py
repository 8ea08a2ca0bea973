"""Doctor's ranking, exit status and text, and the checks that need no kernel or store."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from flannel.backend.plan import NodeView
from flannel.config import NetworkConfig
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route
from flannel.lease import Lease, LeaseAttrs
from flannel.monitor.statusdoc import read_status
from flannel.ops.checks import Context
from flannel.ops.checks.cluster import check_clock, check_duplicates
from flannel.ops.checks.kernel import check_entries, check_skipped
from flannel.ops.checks.node import check_cni, check_sysctls
from flannel.ops.checks.offload import foreign_random_rule
from flannel.ops.findings import Finding, exit_code, rank, render
from flannel.ops.leases import LeaseRow
from flannel.ops.plans import KernelEntries


def context(devices: dict[str, int] | None = None, entries: KernelEntries | None = None,
            **kwargs) -> Context:
    """A context whose view of this node's kernel is given (``devices``: name -> ifindex,
    ``entries``: its routes and neighbours), never read from the test's own namespace."""
    base = {"subnet_file": Path("/nonexistent/subnet.env"), "sysctl_root": Path("/proc/sys"),
            "cni_bin_dirs": [], "cni_conf_dirs": [], "probe_timeout": 1.0,
            "fix_checksum": False}
    ctx = Context(**{**base, **kwargs})
    if ctx.config is not None:
        own = ctx.own_lease
        ctx.__dict__["node"] = NodeView(ctx.config, own, devices or {}, 2,
                                        own.attrs.public_ip if own else None)
    ctx.__dict__["entries"] = entries or KernelEntries()
    return ctx


def vxlan_lease(subnet: str, ip: str, mac: str) -> LeaseRow:
    attrs = LeaseAttrs(public_ip=IPv4Address(ip), backend_type="vxlan",
                       backend_data=f'{{"VNI":1,"VtepMAC":"{mac}"}}')
    lease = Lease(IPv4Network(subnet), attrs=attrs, etcd_lease_id=7)
    return LeaseRow(lease.key, lease, 3600)


def test_causes_come_before_what_they_explain():
    found = [Finding("encap", "error", "peer blocked"), Finding("fdb", "warning", "stale"),
             Finding("routes", "error", "no route"), Finding("flanneld", "error", "not running"),
             Finding("checksum", "info", "turned off")]
    assert [f.check for f in rank(found)] == ["flanneld", "routes", "encap", "fdb", "checksum"]


def test_exit_status_is_zero_only_when_nothing_is_wrong():
    assert exit_code([]) == 0
    assert exit_code([Finding("checksum", "info", "turned off")]) == 0
    assert exit_code([Finding("clock", "warning", "skew")]) == 1


def test_text_output():
    text = render([Finding("cni", "error", "CNI plugin 'bridge' is missing", "install it"),
                   Finding("clock", "warning", "skew")])
    assert text.splitlines() == [
        "unhealthy: 1 error(s), 1 warning(s), most likely cause first",
        "1. [error] cni: CNI plugin 'bridge' is missing", "   fix: install it",
        "2. [warning] clock: skew"]
    assert render([]) == "healthy: every check passed"


def test_clock_skew_beyond_five_seconds():
    assert check_clock(context(clock_skew=4.0)) == []
    [finding] = check_clock(context(clock_skew=-42.4))
    assert finding.what == "this node's clock is 42s behind the store's"


def test_duplicate_public_ip():
    # One node's two leases share its identity: only the address is a duplicate.
    rows = [vxlan_lease("10.244.1.0/24", "192.168.1.1", "0e:00:00:00:00:01"),
            vxlan_lease("10.244.2.0/24", "192.168.1.1", "0E:00:00:00:00:01")]
    found = check_duplicates(context(rows=rows))
    assert [f.what.split(":")[0] for f in found] == [
        "public IP 192.168.1.1 holds several leases (10.244.1.0/24, 10.244.2.0/24)"]
    cfg = NetworkConfig(network=IPv4Network("10.244.0.0/16"), backend_type="vxlan")
    assert check_skipped(context(rows=rows, config=cfg)) == []


def test_a_lease_claiming_another_node_s_identity_is_said_once_as_the_cause():
    """As flanneld judges it: the newer lease claiming the older's VTEP MAC from another
    address is refused (an error naming both, the identity and the fix), the older one is
    judged as usual, and the thief's entries are expected nowhere."""
    mac = "0e:00:00:00:00:02"
    own, victim, thief = (
        replace(row, lease=row.lease.replace(created=created))
        for row, created in ((vxlan_lease("10.244.1.0/24", "192.168.1.1", "0e:00:00:00:00:01"),
                              1),
                             (vxlan_lease("10.244.2.0/24", "192.168.1.2", mac), 2),
                             (vxlan_lease("10.244.3.0/24", "192.168.1.66", mac.upper()), 3)))
    cfg = NetworkConfig(network=IPv4Network("10.244.0.0/16"), backend_type="vxlan")
    route = Route("10.244.2.0/24", "10.244.2.0", 7, onlink=True)
    held = KernelEntries({route.dst: (route, 151)},
                         {(7, "10.244.2.0"): Neighbour(7, "10.244.2.0", mac)},
                         frozenset({FdbEntry(7, mac, "192.168.1.2")}), {7: "flannel.1"})
    ctx = context({"flannel.1": 7}, held, rows=[thief, own, victim], config=cfg,
                  env={"FLANNEL_SUBNET": "10.244.1.1/24"})
    found = rank([*check_duplicates(ctx), *check_skipped(ctx), *check_entries(ctx)])
    assert [(f.check, f.severity) for f in found] == [("identity", "error")]
    assert found[0].what == (
        f"lease 10.244.3.0-24 of 192.168.1.66: skipped by flanneld: its IPv4 VtepMAC {mac} "
        "belongs to the older lease 10.244.2.0-24 (public IP 192.168.1.2): a lease may not "
        "take another node's identity; delete it, or restart the node that wrote it")
    assert "flannelctl leases release 10.244.3.0-24 --yes" in found[0].fix


def test_lease_outside_the_network_is_skipped_as_flanneld_skips_it():
    rows = [vxlan_lease("10.9.1.0/24", "192.168.1.1", "0e:00:00:00:00:01")]
    cfg = NetworkConfig(network=IPv4Network("10.244.0.0/16"), backend_type="vxlan")
    [finding] = check_skipped(context(rows=rows, config=cfg))
    assert (finding.severity, finding.what) == (
        "warning", "lease 10.9.1.0-24 of 192.168.1.1: skipped by flanneld: subnet 10.9.1.0/24 "
        "lies outside the Network 10.244.0.0/16")
    # nor is it a peer doctor expects routes for
    assert context(rows=rows, config=cfg).peers == []


def _sysctl_tree(root: Path, bridge_nf: str | None) -> Path:
    """A /proc/sys stand-in: br_netfilter's sysctls exist for every namespace once the module
    is loaded on the host, so its absence cannot be made in a lab node."""
    (root / "net/ipv4/conf/all").mkdir(parents=True)
    (root / "net/ipv4/ip_forward").write_text("1\n")
    (root / "net/ipv4/conf/all/rp_filter").write_text("0\n")
    if bridge_nf is not None:
        (root / "net/bridge").mkdir(parents=True)
        (root / "net/bridge/bridge-nf-call-iptables").write_text(bridge_nf + "\n")
    return root


def test_missing_br_netfilter_says_to_load_it(tmp_path):
    found = check_sysctls(context(sysctl_root=_sysctl_tree(tmp_path, None)))
    assert [(f.check, f.severity) for f in found] == [("sysctl", "warning")]
    assert found[0].what.startswith("br_netfilter is not loaded")
    assert found[0].fix.startswith("modprobe br_netfilter")
    assert exit_code(found) == 1


def test_bridge_nf_call_iptables_off_says_to_turn_it_on(tmp_path):
    found = check_sysctls(context(sysctl_root=_sysctl_tree(tmp_path, "0")))
    assert [f.what for f in found] == ["net.bridge.bridge-nf-call-iptables is 0"]
    assert found[0].fix == "sysctl -w net.bridge.bridge-nf-call-iptables=1"


def test_no_cni_is_a_note_outside_kubernetes_mode_and_an_error_in_it(tmp_path):
    """An etcd-mode node may run Docker with mk-docker-opts.sh (subnet.env, no CNI); a
    Kubernetes node's pods cannot start without flannel's CNI config and plugins."""
    dirs = {"cni_bin_dirs": [tmp_path / "bin"], "cni_conf_dirs": [tmp_path / "net.d"]}
    etcd = check_cni(context(**dirs))
    assert [(f.severity, f.what) for f in etcd] == [(
        "info", f"no CNI network config in {tmp_path / 'net.d'} uses the flannel plugin: "
        "containers on this node do not get their network through CNI (as with Docker and "
        "mk-docker-opts.sh, which read subnet.env)")]
    assert exit_code(etcd) == 0
    kube = check_cni(context(kube_mode=True, **dirs))
    assert [f.severity for f in kube] == ["error"] * 3
    assert kube[2].what.startswith(f"no CNI network config in {tmp_path / 'net.d'} uses the "
                                   "flannel plugin")
    # A conflist for flannel makes a missing plugin an error in either mode.
    (tmp_path / "net.d").mkdir()
    (tmp_path / "net.d" / "10-flannel.conflist").write_text(
        '{"name": "cbr0", "plugins": [{"type": "flannel"}]}')
    assert [f.what.split(":")[0] for f in check_cni(context(**dirs))] == [
        f"CNI plugins 'bridge', 'host-local', 'portmap' missing from {tmp_path / 'bin'}",
        f"CNI plugin 'flannel' missing from {tmp_path / 'bin'}"]


def test_only_a_masquerade_other_than_flanneld_s_is_a_sign_of_the_checksum_bug():
    own_nft = """table ip nat {
\tchain FLANNEL-POSTRTG {
\t\tip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 counter masquerade fully-random
\t}
}
table ip flannel-ipv4 {
\tchain postrtg {
\t\tip saddr 10.244.0.0/16 masquerade fully-random
\t}
}"""
    assert not foreign_random_rule(own_nft, "fully-random")
    kube_proxy = own_nft + """
table ip nat {
\tchain KUBE-POSTROUTING {
\t\tmeta mark & 0x00004000 == 0x00004000 masquerade fully-random
\t}
}"""
    assert foreign_random_rule(kube_proxy, "fully-random")
    own_save = ('-A FLANNEL-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment '
                '"flanneld masq" -j MASQUERADE --random-fully')
    assert not foreign_random_rule(own_save, "--random-fully")
    assert foreign_random_rule(own_save + "\n-A KUBE-POSTROUTING -j MASQUERADE --random-fully",
                               "--random-fully")


def test_the_device_each_backend_declares_is_checked():
    from flannel.config import parse_config
    from flannel.ops.checks.kernel import check_device
    from flannel.ops.kernelview import KernelView

    def found(backend: str, links: list[dict]) -> list[tuple[str, str]]:
        psk = ',"PSK":"' + "x" * 96 + '"' if backend == "ipsec" else ""
        config = parse_config(f'{{"Network":"10.244.0.0/16","Backend":{{"Type":"{backend}"'
                              f'{psk}}}}}')
        return [(f.severity, f.what) for f in check_device(context(
            config=config, rows=[], kernel=KernelView(links=links)))]

    up = ["BROADCAST", "UP", "LOWER_UP"]
    assert found("udp", []) == [
        ("error", "the device flannel0 does not exist: no traffic to other nodes")]
    assert found("udp", [{"ifname": "flannel0", "flags": up}]) == []
    assert found("wireguard", [{"ifname": "flannel-wg", "flags": ["POINTOPOINT"]}]) == [
        ("error", "flannel-wg is down")]
    assert found("vxlan", []) == [
        ("error", "the device flannel.1 does not exist: no traffic to other nodes")]
    # charon's ipsec0 exists only with kernel-libipsec: its absence is no fault.
    assert found("host-gw", []) == found("extension", []) == found("aws-vpc", []) == \
        found("ipsec", []) == []


def test_udp_and_wireguard_need_their_route_over_the_network():
    from flannel.config import parse_config

    config = parse_config('{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}')
    key = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
    peer = LeaseRow("10.244.2.0-24", Lease(IPv4Network("10.244.2.0/24"), attrs=LeaseAttrs(
        IPv4Address("192.168.111.12"), backend_type="wireguard",
        backend_data=f'{{"PublicKey":"{key}","Port":51820}}'), etcd_lease_id=3), 3600)

    def found(routes: list[Route]) -> list[str]:
        return [f.what for f in check_entries(context(
            {"flannel-wg": 5, "eth0": 2}, KernelEntries({r.dst: (r, 4) for r in routes},
                                                      names={5: "flannel-wg", 2: "eth0"}),
            config=config, env={"FLANNEL_SUBNET": "10.244.1.1/24"}, rows=[peer]))]

    assert found([Route("10.244.0.0/16", None, 5)]) == []
    assert found([Route("0.0.0.0/0", "192.168.111.1", 2)]) == [
        "no route to the Network 10.244.0.0/16 through flannel-wg: no traffic to other nodes"]


def test_ipv6_for_a_backend_declaring_none_is_named_before_flanneld_refuses_it():
    from flannel.config import parse_config
    from flannel.ops.checks.cluster import check_store

    def found(backend: str) -> list[str]:
        config = parse_config(f'{{"Network":"10.244.0.0/16","EnableIPv6":true,'
                              f'"IPv6Network":"fd00:244::/56","Backend":{{"Type":"{backend}"}}}}')
        return [f.what for f in check_store(context(config=config, rows=[]))]

    assert found("udp") == ["the network config enables IPv6, which the udp backend does not "
                            "carry: flanneld refuses to start"]
    assert found("ipip") != [] and found("aws-vpc") != []
    assert found("vxlan") == found("wireguard") == found("host-gw") == []


def test_the_encapsulation_port_is_the_declared_one_unless_port_is_set():
    from flannel.config import parse_config

    def ports(backend: str) -> tuple[int, ...]:
        description = context(config=parse_config(
            f'{{"Network":"10.244.0.0/16","Backend":{backend}}}'), rows=[]).description
        assert description is not None
        return description.node.injectable

    assert ports('{"Type":"vxlan"}') == (8472,)
    assert ports('{"Type":"vxlan","Port":4789}') == (4789,)
    assert ports('{"Type":"udp"}') == (8285,)
    assert ports('{"Type":"udp","Port":8286}') == (8286,)
    # WireGuard authenticates what it takes; host-gw takes no encapsulated packets.
    assert ports('{"Type":"wireguard","ListenPort":51820}') == ports('{"Type":"host-gw"}') == ()


def test_an_ipip_route_goes_via_the_peer_s_public_ip_on_its_device():
    from flannel.config import parse_config

    config = parse_config('{"Network":"10.244.0.0/16","Backend":{"Type":"ipip"}}')
    peer = LeaseRow("10.244.2.0-24", Lease(IPv4Network("10.244.2.0/24"), attrs=LeaseAttrs(
        IPv4Address("192.168.111.12"), backend_type="ipip"), etcd_lease_id=3), 3600)

    def found(gateway: str) -> list[str]:
        route = Route("10.244.2.0/24", gateway, 9, onlink=True)
        return [f.what for f in check_entries(context(
            {"flannel.ipip": 9}, KernelEntries({route.dst: (route, 151)},
                                               names={9: "flannel.ipip"}),
            config=config, env={"FLANNEL_SUBNET": "10.244.1.1/24"}, rows=[peer]))]

    assert found("192.168.111.12") == []
    assert found("10.244.2.0") == ["the route to 10.244.2.0/24 goes via 10.244.2.0 dev "
                                   "flannel.ipip; node 192.168.111.12 needs via "
                                   "192.168.111.12 dev flannel.ipip"]


def _hostgw(third: int) -> LeaseRow:
    lease = Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        IPv4Address(f"192.168.1.{third}" if third < 100 else "192.168.200.5"),
        backend_type="host-gw"), etcd_lease_id=3)
    return LeaseRow(lease.key, lease, 3600)


PARKED_WHY = ("Network is unreachable (replace route 10.244.200.0/24 via 192.168.200.5); "
              "host-gw needs every node on one L2 segment")


def _flanneld_says(ctx: Context, status: dict) -> Context:
    """``ctx`` with a flanneld running here whose /status is ``status``."""
    from flannel.ops.discover import Flanneld
    from flannel.ops.flanneldview import probes_of, view_of

    ctx.flanneld_pids, ctx.flanneld = [1], Flanneld(1, {}, "", Path("/"), Path("/"))
    ctx.__dict__["view"] = view_of(read_status({"ready": True, **status}))
    ctx.__dict__["probed"] = probes_of(status.get("probes", {}))  # its /probes, if given
    return ctx


def _parked_context(status: dict) -> Context:
    from flannel.config import parse_config

    route = Route("10.244.2.0/24", "192.168.1.2", 2)
    held = KernelEntries({route.dst: (route, 151)}, names={2: "eth0"})
    return _flanneld_says(context(
        entries=held, config=parse_config('{"Network":"10.244.0.0/16","Backend":'
                                          '{"Type":"host-gw"}}'),
        env={"FLANNEL_SUBNET": "10.244.1.1/24"}, rows=[_hostgw(1), _hostgw(2), _hostgw(200)]),
        status)


def test_a_peer_flanneld_parked_is_named_with_its_reason_not_as_a_missing_route():
    from flannel.ops.check import plan
    from flannel.ops.checks.kernel import check_parked

    status = {"ready": True, "peers": {
        "refused": 1, "refused_reasons": {"10.244.200.0-24": PARKED_WHY},
        "refused_kinds": {"10.244.200.0-24": "kernel_refused"}}, "rules": {}}
    ctx = _parked_context(status)
    assert check_entries(ctx) == []
    [parked] = check_parked(ctx)
    assert (parked.check, parked.severity, parked.what) == (
        "parked", "warning", f"lease 10.244.200.0-24 of 192.168.200.5: parked by flanneld, the "
        f"kernel refused its entries: {PARKED_WHY}")
    assert ctx.description is not None
    _probe, decided = plan(ctx, ctx.description, ctx.entries, None)
    assert [(str(row.subnet), row.verdict, row.detail) for row in decided] == [
        ("10.244.200.0/24", "parked", "parked by flanneld, the kernel refused its entries: "
         f"{PARKED_WHY}")]
    # An engine's refusal is named with its reason.
    engine = _parked_context({"peers": {"refused": 1, "refused_reasons": {
        "10.244.2.0-24": "IKE authentication fails: another PSK"},
        "refused_kinds": {"10.244.2.0-24": "engine"}}})
    assert [(f.severity, f.what) for f in check_parked(engine)] == [
        ("warning", "lease 10.244.2.0-24 of 192.168.1.2: refused by the backend's engine: IKE "
         "authentication fails: another PSK")]
    # Without flanneld's word, the missing route is all there is to say.
    unread = _parked_context({})
    unread.__dict__["view"] = replace(unread.view, unread="flanneld's /status could not be "
                                      "read: nobody answers")
    assert [f.what for f in check_entries(unread)] == [
        "no route to 10.244.200.0/24 (node 192.168.200.5)"]
    assert [(f.severity, f.what) for f in check_parked(unread)] == [
        ("info", "not checked: which peers flanneld parked (the kernel refused their entries), "
         "because flanneld's /status could not be read: nobody answers")]


def test_a_status_answer_is_read_as_untrusted_input():
    from flannel.ops.flanneldview import view_of

    view = view_of(read_status({
        "ready": True, "rules": None,
        "peers": {"refused": 9, "refused_reasons": {"a": "why", "b": 3, "c": "x"},
                  "refused_kinds": {"a": "kernel_refused", "b": "engine"}}}))
    assert (dict(view.refused), view.unlisted, view.pod_encap_drop) == (
        {"a": ("kernel_refused", "why")}, 8, None)
    assert view_of(read_status({"ready": True, "peers": [],
                                "rules": {"pod_encap_drop": {}}})).pod_encap_drop is True


def test_pods_that_may_send_unauthenticated_encapsulation_are_noted():
    from flannel.config import parse_config
    from flannel.ops.checks.node import check_pod_encap

    def found(backend: str, drop: bool) -> list[Finding]:
        ctx = context(config=parse_config(f'{{"Network":"10.244.0.0/16","Backend":'
                                          f'{{"Type":"{backend}"}}}}'), rows=[])
        return check_pod_encap(_flanneld_says(ctx, {"rules": {"pod_encap_drop": {}}
                                                    if drop else {}}))

    [note] = found("vxlan", drop=False)
    assert (note.severity, note.what.split(",")[0]) == (
        "info", "pods on this node may send VXLAN (UDP 8472) to other nodes")
    assert "--drop-pod-encap=true" in note.fix
    assert found("vxlan", drop=True) == []
    # An authenticated carrier takes no forged packet; plain routing has none to forge.
    assert found("wireguard", drop=False) == found("host-gw", drop=False) == []


def _probed(result: str, age: float, detail: str = "") -> dict:
    """A /probes document: flanneld probed the peer 10.244.2.0-24 ``age`` seconds ago."""
    return {"period_seconds": 30, "fresh_seconds": 33.25, "peers": [
        {"lease": "10.244.2.0-24", "family": 4, "result": result, "age_seconds": age,
         "rtt_ms": 0.4 if result == "reached" else None, "detail": detail}]}


BLOCKED = ("node 192.168.1.2 answers ping but VXLAN traffic to UDP 8472 gets no answer: a "
           "firewall drops it")


def test_check_takes_flanneld_fresh_result_and_probes_a_stale_one():
    from flannel.ops.check import plan

    for document, max_age, verdict in (
            (_probed("encap_blocked", 20, BLOCKED), None, "timeout"),
            (_probed("reached", 33, ""), None, "ok"),
            (_probed("encap_blocked", 34, BLOCKED), None, None),  # older than fresh_seconds
            (_probed("encap_blocked", 20, BLOCKED), 10.0, None),  # older than --max-age
            (_probed("encap_blocked", 20, BLOCKED), 0.0, None),  # --max-age=0: always probe
            (_probed("mtu_too_small", 5, "..."), None, None),  # left to check's own echoes
            ({"period_seconds": None, "peers": []}, None, None)):  # flanneld does not probe
        ctx = _parked_context({"probes": document})
        ctx.max_age = max_age
        assert ctx.description is not None
        probe, decided = plan(ctx, ctx.description, ctx.entries, None)
        rows = {str(row.subnet): row for row in probe + decided}
        row = rows["10.244.2.0/24"]
        if verdict is None:
            assert row in probe, (document, max_age)
            continue
        assert row in decided and row.verdict == verdict, (document, max_age, row)
        if verdict == "timeout":
            assert row.detail == f"{BLOCKED} (flanneld's own probe, 20s ago)"


def test_doctor_names_flanneld_cause_as_its_own_finding():
    from flannel.ops.checks.probes import from_flanneld

    ctx = _parked_context({"probes": _probed("encap_blocked", 20, BLOCKED)})
    [peer] = [p for p in ctx.peers if p.lease.key == "10.244.2.0-24"]
    family = peer.families[0]
    [finding] = from_flanneld(ctx, peer, family, False)
    assert (finding.check, finding.severity) == ("encap", "error")
    assert finding.what == f"{BLOCKED} (flanneld's own probe, 20s ago)"
    assert from_flanneld(ctx, peer, family, True) == []  # this node's own rules: said once
    reached = _parked_context({"probes": _probed("reached", 3)})
    assert from_flanneld(reached, peer, family, False) == []
    stale = _parked_context({"probes": _probed("peer_down", 60, "down")})
    assert from_flanneld(stale, peer, family, False) is None  # doctor probes itself
