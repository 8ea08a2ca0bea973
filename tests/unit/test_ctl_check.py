"""``flannelctl check``: ICMP packets built and parsed byte by byte, the verdicts, the node
table and the lab matrix an operator reads."""

from __future__ import annotations

import json
import random
import socket
import struct
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from flannel.backend import describe, supported
from flannel.backend.plan import PLAIN, Carrier, NodeView, PeerPlan
from flannel.backend.vxlan import VxlanBackend
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route
from flannel.lease import Lease, LeaseAttrs
from flannel.ops.check import NodeCheck, PeerResult, judge, render
from flannel.ops.checklab import LabNode, NodeOutcome, pairs_of
from flannel.ops.checklab import render as render_lab
from flannel.ops.commands import script
from flannel.ops.parsers import add_check
from flannel.ops.plans import KernelEntries, kernel_gaps
from flannel.probing import icmp


def ipv4(src: str, dst: str, payload: bytes, proto: int = socket.IPPROTO_ICMP,
         options: bytes = b"") -> bytes:
    """An IPv4 packet as a raw socket hands it over (the header checksum is not checked)."""
    ihl = 5 + len(options) // 4
    header = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 20 + len(options) + len(payload), 7,
                         0, 64, proto, 0, IPv4Address(src).packed, IPv4Address(dst).packed)
    return header + options + payload


#: An echo's payload: the probe's secret first, then zeros to ping's default size.
SECRET = b"s3cr3t!!"
PAYLOAD = icmp.payload(SECRET, icmp.SMALL)


def icmp_message(kind: int, code: int, rest: bytes, body: bytes) -> bytes:
    unsummed = struct.pack("!BBH", kind, code, 0) + rest + body
    return struct.pack("!BBH", kind, code, icmp.checksum(unsummed)) + rest + body


# -- packets -------------------------------------------------------------------------------

def test_checksum_matches_rfc1071_example():
    assert icmp.checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D
    assert icmp.checksum(b"\x01") == 0xFEFF  # odd length: padded with a zero byte


def test_checksum_is_the_ones_complement_of_the_folded_sum_of_words():
    def word_by_word(data: bytes) -> int:  # RFC 1071, section 4.1
        data += b"\0" * (len(data) % 2)
        total = 0
        for (word,) in struct.iter_unpack("!H", data):
            total += word
            total = (total & 0xFFFF) + (total >> 16)
        return ~total & 0xFFFF

    assert icmp.checksum(b"") == icmp.checksum(b"\0" * 1472) == 0xFFFF
    # Words summing to a non-zero multiple of 0xFFFF fold to 0xFFFF, whose complement is 0.
    assert icmp.checksum(b"\xff\xff") == icmp.checksum(b"\x80\x00\x7f\xff") == 0
    for size in (1, 2, 7, 8, 64, 1472, 1473):
        for seed in range(20):
            data = random.Random(seed * 10000 + size).randbytes(size)
            assert icmp.checksum(data) == word_by_word(data), (size, seed)


def test_echo_request_bytes():
    assert icmp.echo_request(0x1234, 1, b"") == bytes.fromhex("0800e5ca12340001")
    packet = icmp.echo_request(0xABCD, 0x10002, PAYLOAD)  # the sequence wraps at 16 bits
    assert packet[:2] == b"\x08\x00"
    assert struct.unpack("!HH", packet[4:8]) == (0xABCD, 2)
    assert len(packet) == 64 and packet[8:] == PAYLOAD
    assert icmp.checksum(packet) == 0


def test_echo_reply_is_parsed():
    reply = icmp_message(icmp.ECHO_REPLY, 0, struct.pack("!HH", 0xABCD, 7), PAYLOAD)
    answer = icmp.parse(ipv4("10.244.2.0", "10.244.1.0", reply))
    assert answer == icmp.Answer(0xABCD, 7, IPv4Address("10.244.2.0"),
                                 IPv4Address("10.244.2.0"), data=SECRET)
    # IP options move the ICMP header: the IHL says where it starts.
    with_options = ipv4("10.244.2.0", "10.244.1.0", reply, options=b"\x01\x01\x01\x00")
    assert icmp.parse(with_options) == answer


def test_unreachable_names_the_router_and_the_echo_it_quotes():
    echo = icmp.echo_request(0xABCD, 9, PAYLOAD)
    quoted = ipv4("10.244.1.0", "10.244.3.0", echo)[:36]  # headers + the secret, as Linux
    error = icmp_message(icmp.DEST_UNREACHABLE, 1, b"\0\0\0\0", quoted)  # quotes it
    answer = icmp.parse(ipv4("192.168.111.1", "10.244.1.0", error))
    assert answer == icmp.Answer(0xABCD, 9, IPv4Address("10.244.3.0"),
                                 IPv4Address("192.168.111.1"), "host unreachable", SECRET)
    prohibited = icmp_message(icmp.DEST_UNREACHABLE, 13, b"\0\0\0\0", quoted)
    assert icmp.parse(ipv4("10.0.0.1", "10.244.1.0", prohibited)).error == \
        "communication administratively prohibited"
    loop = icmp_message(icmp.TIME_EXCEEDED, 0, b"\0\0\0\0", quoted)
    assert icmp.parse(ipv4("10.0.0.1", "10.244.1.0", loop)).error == \
        "time to live exceeded (a routing loop?)"


@pytest.mark.parametrize("packet", [
    b"",
    b"\x45" * 19,  # shorter than an IPv4 header
    ipv4("10.0.0.1", "10.0.0.2", b"")[:20].replace(b"\x45", b"\x65", 1),  # IPv6 version
    bytes([0x4F]) + ipv4("10.0.0.1", "10.0.0.2", b"\0" * 8)[1:],  # IHL beyond the packet
    ipv4("10.0.0.1", "10.0.0.2", b"\0\0\0"),  # ICMP shorter than its header
    ipv4("10.0.0.1", "10.0.0.2", icmp.echo_request(1, 1, PAYLOAD), proto=socket.IPPROTO_UDP),
    ipv4("10.0.0.2", "10.0.0.1", icmp.echo_request(1, 1, PAYLOAD)),  # our own, looped back
    ipv4("10.0.0.2", "10.0.0.1", b"\x00\x00\x00\x00\x00\x01\x00\x01"),  # bad checksum
], ids=["empty", "short", "not-v4", "ihl", "short-icmp", "udp", "request", "checksum"])
def test_what_is_not_an_answer_is_ignored(packet):
    assert icmp.parse(packet) is None


def test_errors_about_other_traffic_are_ignored():
    # An error about a UDP datagram is read for its ports (the pinger then takes it only
    # for a datagram of its own port carrying a probe's secret).
    udp = ipv4("10.244.1.0", "10.244.3.0", b"\x12\x34\x21\x18\x00\x08\x00\x00",
               proto=socket.IPPROTO_UDP)
    about_udp = icmp_message(icmp.DEST_UNREACHABLE, 3, b"\0\0\0\0", udp)
    answer = icmp.parse(ipv4("10.244.3.0", "10.244.1.0", about_udp))
    assert answer is not None and (answer.sport, answer.dport) == (0x1234, 8472)
    assert answer.unreachable_port and answer.data == b""
    reply = ipv4("10.244.1.0", "10.244.3.0", icmp_message(0, 0, b"\0\1\0\1", b""))
    about_reply = icmp_message(icmp.DEST_UNREACHABLE, 1, b"\0\0\0\0", reply)
    assert icmp.parse(ipv4("10.244.3.0", "10.244.1.0", about_reply)) is None
    echo = icmp.echo_request(1, 1, PAYLOAD)
    truncated = icmp_message(icmp.DEST_UNREACHABLE, 1, b"\0\0\0\0",
                             ipv4("10.244.1.0", "10.244.3.0", echo)[:24])
    assert icmp.parse(ipv4("10.244.3.0", "10.244.1.0", truncated)) is None


# -- verdicts and tables -------------------------------------------------------------------

def row(subnet: str, public: str, **kw: object) -> PeerResult:
    return PeerResult(IPv4Network(subnet), public, "vxlan", **kw)


def describe_one(backend: str, lease: Lease, **options: object) -> PeerPlan:
    from flannel.backend import backend_class
    from flannel.config import parse_config

    config = parse_config(json.dumps({"Network": "10.244.0.0/16",
                                       "Backend": {"Type": backend, **options}}))
    own = Lease(IPv4Network("10.244.1.0/24"), attrs=LeaseAttrs(IPv4Address("192.168.111.11")))
    node = NodeView(config, own, {"flannel.1": 7, "flannel0": 8, "flannel-wg": 9,
                                  "flannel.ipip": 10}, 2, IPv4Address("192.168.111.11"))
    return backend_class(backend).describe(node, [lease]).peers[0]


def test_target_is_the_base_address_on_a_device_and_the_cni0_gateway_otherwise():
    subnet = IPv4Network("10.244.7.0/24")
    for backend in supported():
        lease_type = describe(backend)
        assert lease_type is not None
        peer = Lease(subnet, attrs=LeaseAttrs(IPv4Address("192.168.111.17"),
                                              backend_type=lease_type[0],
                                              backend_data=DATA.get(backend)))
        options = {"PSK": "x" * 96} if backend == "ipsec" else {}
        family = describe_one(backend, peer, **options).family(4)
        assert family is not None, backend
        base = backend in ("vxlan", "udp", "wireguard", "ipip")
        assert family.answers_on == IPv4Address("10.244.7.0" if base else "10.244.7.1"), \
            backend


DATA = {"vxlan": '{"VNI":1,"VtepMAC":"f6:be:b0:e3:fd:1c"}',
        "wireguard": '{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=","Port":51820}'}


def test_every_backend_declares_what_the_tools_judge():
    """Each backend says how its peers show in the kernel; the lease type is its own."""
    judged = {name: describe(name) for name in supported()}
    assert {name: (lease_type, fp.routes) for name, (lease_type, fp) in judged.items()} == {
        "ali-vpc": ("", "elsewhere"),
        "alloc": ("", "no-data-path"), "aws-vpc": ("", "elsewhere"),
        "extension": ("extension", "by-user"), "gce": ("", "elsewhere"),
        "host-gw": ("host-gw", "per-peer"),
        "ipip": ("ipip", "per-peer"), "ipsec": ("ipsec", "elsewhere"),
        "tencent-vpc": ("", "elsewhere"),
        "udp": ("", "covering"), "vxlan": ("vxlan", "per-peer"),
        "wireguard": ("wireguard", "covering")}
    assert {name: fp.device_name(7) for name, (_, fp) in judged.items() if fp.device} == {
        "ipip": "flannel.ipip", "udp": "flannel0", "vxlan": "flannel.7",
        "wireguard": "flannel-wg"}
    assert all(fp.unjudged for _, fp in judged.values()
               if fp.routes not in ("per-peer", "covering"))
    assert describe("nonsense") is None


def test_what_flanneld_has_not_programmed_is_named():
    mac = "f6:be:b0:e3:fd:1c"
    lease = Lease(IPv4Network("10.244.3.0/24"), attrs=LeaseAttrs(
        IPv4Address("192.168.111.13"), backend_type="vxlan", backend_data=DATA["vxlan"]))
    vxlan = describe_one("vxlan", lease)
    family = vxlan.family(4)
    assert family is not None
    names = {7: "flannel.1", 2: "eth0"}
    route = Route("10.244.3.0/24", "10.244.3.0", 7, onlink=True)
    neighbour = Neighbour(7, "10.244.3.0", mac)
    fdb = FdbEntry(7, mac, "192.168.111.13")
    full = KernelEntries({route.dst: (route, 151)}, {(7, "10.244.3.0"): neighbour},
                         frozenset({fdb}), names)
    assert kernel_gaps(vxlan, family, full) == []
    assert [gap.what for gap in kernel_gaps(vxlan, family, KernelEntries(names=names))] == [
        "no route to 10.244.3.0/24 (node 192.168.111.13)",
        f"the neighbour entry 10.244.3.0 -> {mac} for node 192.168.111.13 is missing on "
        "flannel.1",
        f"no FDB entry {mac} dst 192.168.111.13 on flannel.1: traffic to node 192.168.111.13 "
        "has nowhere to go"]
    other = KernelEntries({route.dst: (Route(route.dst, "192.168.111.13", 2), 151)},
                          {(7, "10.244.3.0"): Neighbour(7, "10.244.3.0", "02:00:00:00:00:01")},
                          frozenset({fdb}), names)
    assert [(gap.kind, gap.what) for gap in kernel_gaps(vxlan, family, other)] == [
        ("routes", "the route to 10.244.3.0/24 goes via 192.168.111.13 dev eth0; node "
                   "192.168.111.13 needs via 10.244.3.0 dev flannel.1"),
        ("neighbours", f"the neighbour entry 10.244.3.0 -> {mac} for node 192.168.111.13 "
                       "has 02:00:00:00:00:01 on flannel.1")]
    # udp: one route over the Network through its device carries every peer.
    udp_lease = Lease(lease.subnet, attrs=LeaseAttrs(IPv4Address("192.168.111.13")))
    udp = describe_one("udp", udp_lease)
    udp_family = udp.family(4)
    assert udp_family is not None
    assert [gap.what for gap in kernel_gaps(udp, udp_family, KernelEntries(names={8: "flannel0"}))
            ] == ["no route to the Network 10.244.0.0/16 through flannel0: no traffic to other "
                  "nodes"]
    # The extension's commands and a VPC's route table hold nothing in this node's kernel.
    for backend in ("extension", "aws-vpc"):
        plain = Lease(lease.subnet, attrs=LeaseAttrs(
            IPv4Address("192.168.111.13"), backend_type="extension" if backend == "extension"
            else ""))
        peer_plan = describe_one(backend, plain)
        assert kernel_gaps(peer_plan, peer_plan.families[0], KernelEntries()) == []


def test_verdicts_from_probes():
    vxlan = Carrier("VXLAN", udp_ports=(8472,), refuses=True)
    ok = row("10.244.2.0/24", "192.168.111.12", target="10.244.2.0")
    judge(ok, icmp.Probe(IPv4Address("10.244.2.0"), 3, [0.001, 0.002, 0.003]), 1.0)
    assert (ok.verdict, ok.detail, ok.loss) == ("ok", "", 0)
    lossy = row("10.244.2.0/24", "192.168.111.12", target="10.244.2.0")
    judge(lossy, icmp.Probe(IPv4Address("10.244.2.0"), 3, [0.001]), 1.0)
    assert (lossy.verdict, lossy.detail) == ("lossy",
                                             "2 of 3 echoes to 10.244.2.0 got no answer")
    assert lossy.answers
    silent = row("10.244.3.0/24", "192.168.111.13", target="10.244.3.0", carrier=vxlan)
    judge(silent, icmp.Probe(IPv4Address("10.244.3.0"), 3), 1.0)
    assert silent.verdict == "timeout" and not silent.answers
    assert silent.detail == "no answer from 10.244.3.0 to 3 echoes within 1s"
    assert silent.next_step == (
        "run flannelctl doctor on this node: it probes this node's own firewall, "
        "192.168.111.13 on the underlay and VXLAN on UDP 8472, telling a node that is down "
        "from a blocked port; then on the node 192.168.111.13")
    # Advice names only the probes doctor makes: none of a carrier it cannot probe.
    routed = row("10.244.3.0/24", "192.168.111.13", target="10.244.3.1", carrier=PLAIN)
    judge(routed, icmp.Probe(IPv4Address("10.244.3.1"), 3), 1.0)
    assert routed.next_step == (
        "run flannelctl doctor on this node: it probes this node's own firewall, "
        "192.168.111.13 on the underlay; then on the node 192.168.111.13")
    refused = row("10.244.3.0/24", "192.168.111.13", target="10.244.3.0")
    judge(refused, icmp.Probe(IPv4Address("10.244.3.0"), 3,
                              errors=["host unreachable from 10.244.1.0"] * 2), 1.0)
    assert (refused.verdict, refused.detail) == (
        "unreachable", "host unreachable from 10.244.1.0 (2 of 3 echoes)")
    unsendable = row("10.244.3.0/24", "192.168.111.13", target="10.244.3.0")
    judge(unsendable, icmp.Probe(IPv4Address("10.244.3.0"), 0, send_error="No route to host"),
          1.0)
    assert (unsendable.verdict, unsendable.detail, unsendable.loss) == (
        "unreachable", "echoes to 10.244.3.0 cannot be sent: No route to host", None)


def test_node_table():
    peers = [row("10.244.2.0/24", "192.168.111.12", target="10.244.2.0", sent=3,
                 rtts=(0.0004, 0.0002, 0.0009), verdict="ok"),
             row("10.244.3.0/24", "192.168.111.13", target="10.244.3.0", sent=3,
                 verdict="timeout", detail="no answer from 10.244.3.0 to 3 echoes within 1s",
                 next_step="run flannelctl doctor on this node"),
             row("10.244.4.0/24", "192.168.111.14", verdict="not-programmed",
                 detail="this node has no route to 10.244.4.0/24")]
    check = NodeCheck(IPv4Network("10.244.1.0/24"), "192.168.111.11", "vxlan", "10.244.1.0",
                      peers)
    assert not check.ok
    assert render(check) == """\
this node: 10.244.1.0/24 (192.168.111.11, vxlan), echoes from 10.244.1.0
PEER SUBNET    PUBLIC IP       BACKEND  TARGET      P50     MAX     LOSS  VERDICT
10.244.2.0/24  192.168.111.12  vxlan    10.244.2.0  0.40ms  0.90ms  0%    ok
10.244.3.0/24  192.168.111.13  vxlan    10.244.3.0  -       -       100%  TIMEOUT
10.244.4.0/24  192.168.111.14  vxlan    -           -       -       -     NOT-PROGRAMMED
2 of 3 peers do not answer:
  10.244.3.0/24 (192.168.111.13): timeout: no answer from 10.244.3.0 to 3 echoes within 1s
    next: run flannelctl doctor on this node
  10.244.4.0/24 (192.168.111.14): not-programmed: this node has no route to 10.244.4.0/24"""
    doc = check.as_json()
    assert doc["ok"] is False
    assert doc["peers"][0]["rtt_ms"] == {"p50": 0.4, "max": 0.9}
    assert (doc["peers"][1]["loss"], doc["peers"][1]["received"]) == (1.0, 0)
    alone = NodeCheck(IPv4Network("10.244.1.0/24"), "192.168.111.11", "vxlan", "", [])
    assert alone.ok
    assert render(alone).splitlines()[1] == "no peers: this node holds the only lease"


def test_rows_flanneld_judged_are_said_so_and_answering_ones_not_listed_as_failing():
    # flanneld's own probes give every row a note, the rows that answer too.
    peers = [row("10.244.2.0/24", "192.168.111.12", target="10.244.2.0", sent=1,
                 rtts=(0.0002,), verdict="ok", detail="flanneld's own probe, 3s ago",
                 by_flanneld=True),
             row("10.244.3.0/24", "192.168.111.13", target="10.244.3.0", sent=1,
                 verdict="timeout", detail="node 192.168.111.13 answers ping but VXLAN "
                 "traffic to UDP 8472 gets no answer (flanneld's own probe, 8s ago)",
                 next_step="run flannelctl doctor on this node (--max-age=0 to probe from "
                 "here)", by_flanneld=True)]
    check = NodeCheck(IPv4Network("10.244.1.0/24"), "192.168.111.11", "vxlan", "", peers)
    # This check sent no echo: it does not say where its echoes left from.
    assert render(check).splitlines()[0] == (
        "this node: 10.244.1.0/24 (192.168.111.11, vxlan), no echoes sent, rows judged from "
        "flanneld's own probes noted so")
    assert render(check).splitlines()[4:] == [
        "1 of 2 peers do not answer:",
        "  10.244.3.0/24 (192.168.111.13): timeout: node 192.168.111.13 answers ping but "
        "VXLAN traffic to UDP 8472 gets no answer (flanneld's own probe, 8s ago)",
        "    next: run flannelctl doctor on this node (--max-age=0 to probe from here)",
        "of those that answer:",
        "  10.244.2.0/24 (192.168.111.12): ok: flanneld's own probe, 3s ago"]
    peers[1] = row("10.244.3.0/24", "192.168.111.13", target="10.244.3.0", sent=3,
                   rtts=(0.0003, 0.0003, 0.0003), verdict="ok")
    check = NodeCheck(IPv4Network("10.244.1.0/24"), "192.168.111.11", "vxlan", "10.244.1.0",
                      peers)
    assert render(check).splitlines()[0] == (
        "this node: 10.244.1.0/24 (192.168.111.11, vxlan), echoes from 10.244.1.0, rows "
        "judged from flanneld's own probes noted so")
    assert render(check).splitlines()[4:] == [
        "every peer answers (2)",
        "  10.244.2.0/24 (192.168.111.12): ok: flanneld's own probe, 3s ago"]


def outcome(index: int, subnet: str, peers: list[dict]) -> NodeOutcome:
    node = LabNode(index, f"lab-n{index}", f"192.168.111.{10 + index}",
                   f"/run/lab/n{index}/subnet.env")
    return NodeOutcome(node, {"ok": True, "node": {"subnet": subnet}, "peers": peers})


def peer(index: int, verdict: str, p50: float | None = None, detail: str = "") -> dict:
    return {"subnet": f"10.244.{index}.0/24", "public_ip": f"192.168.111.{10 + index}",
            "verdict": verdict, "detail": detail, "rtt_ms": {"p50": p50, "max": p50}}


def test_lab_matrix_names_failing_pairs_and_where_to_look():
    outcomes = [
        outcome(1, "10.244.1.0/24", [peer(2, "ok", 0.41), peer(3, "timeout", detail="silence")]),
        outcome(2, "10.244.2.0/24", [peer(1, "ok", 0.38)]),  # sees no lease of node 3
        NodeOutcome(LabNode(3, "lab-n3", "192.168.111.13", "/run/lab/n3/subnet.env"),
                    error="the check in lab-n3 failed (exit 1): boom"),
    ]
    pairs = pairs_of(outcomes)
    assert [(p.source.label, p.dest.label if p.dest else None, p.verdict) for p in pairs] == [
        ("n1", "n2", "ok"), ("n1", "n3", "timeout"), ("n2", "n1", "ok"),
        ("n2", "n3", "no-lease")]
    # Printed commands name the console script by its full path, so they work when pasted.
    ctl = script("flannelctl")
    assert render_lab("lab", "http://192.168.111.1:2379", outcomes, pairs) == f"""\
lab lab: 3 nodes, 4 pairs checked, 2 failing, 1 nodes not checked
from \\ to          n1 10.244.1.0/24  n2 10.244.2.0/24  n3 ?
n1 192.168.111.11  -                 ok 0.41ms         TIMEOUT
n2 192.168.111.12  ok 0.38ms         -                 NO-LEASE
n3 192.168.111.13  NOT CHECKED       NOT CHECKED       -
n3 not checked: the check in lab-n3 failed (exit 1): boom
  next: ip netns exec lab-n3 {ctl} doctor --etcd-endpoints=http://192.168.111.1:2379 \
--subnet-file=/run/lab/n3/subnet.env
failing pairs:
  n1 -> n3: timeout: silence
    next: run flannelctl doctor on n1, then on n3
    n1: ip netns exec lab-n1 {ctl} doctor --etcd-endpoints=http://192.168.111.1:2379 \
--subnet-file=/run/lab/n1/subnet.env
  n2 -> n3: no-lease: n3 holds no lease in the store (is its flanneld running?)
    next: run flannelctl doctor on n3
    n3: ip netns exec lab-n3 {ctl} doctor --etcd-endpoints=http://192.168.111.1:2379 \
--subnet-file=/run/lab/n3/subnet.env"""


@pytest.mark.parametrize("flag", ["--count=0", "--count=101", "--timeout=0.01",
                                  "--parallel=0", "--deadline=nan", "--interval=x"])
def test_bad_bounds_are_refused(flag, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="flannelctl")
    add_check(parser.add_subparsers())
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["check", flag])
    assert exit_.value.code == 2
    name, value = flag.split("=")
    assert f"argument {name}: '{value}': give" in capsys.readouterr().err


def test_lab_state_is_read_as_untrusted_input(tmp_path):
    from flannel.ops.checklab import LabCheckError, read_lab

    with pytest.raises(LabCheckError) as missing:
        read_lab("nolab", tmp_path)
    assert str(missing.value) == (f"no lab named nolab under {tmp_path} ('flannel-lab up "
                                  "--name nolab' builds one; --lab-root if it lives elsewhere)")
    (tmp_path / "lab").mkdir()
    state = tmp_path / "lab" / "state.json"
    node = {"index": 1, "netns": "lab-n1", "address": "192.168.111.11",
            "subnet_file": "/run/lab/n1/subnet.env"}
    state.write_text(json.dumps({"etcd_endpoint": "http://192.168.111.1:2379",
                                 "nodes": [node]}))
    assert read_lab("lab", tmp_path) == (
        "http://192.168.111.1:2379", [LabNode(1, "lab-n1", "192.168.111.11",
                                              "/run/lab/n1/subnet.env")])
    for bad, message in (
            ({**node, "netns": "other-n1"}, "node 1 does not belong to lab lab"),
            ({**node, "subnet_file": "n1/subnet.env"}, "node 1 does not belong to lab lab"),
            ({**node, "address": "eth0"}, "a node entry is unusable"),
            ("n1", "a node entry is unusable")):
        state.write_text(json.dumps({"etcd_endpoint": "http://x:1", "nodes": [bad]}))
        with pytest.raises(LabCheckError, match=message):
            read_lab("lab", tmp_path)
    state.write_text("[]")
    with pytest.raises(LabCheckError, match="describes no running lab"):
        read_lab("lab", tmp_path)


@pytest.fixture
def flannel_log_level():
    """The command quiets the store's logs for its process; give the next tests theirs."""
    import logging

    logger = logging.getLogger("flannel")
    level = logger.level
    yield
    logger.setLevel(level)


def test_no_subnet_env_is_said_plainly(tmp_path, capsys, flannel_log_level):
    from flannel.ctl import main

    missing = tmp_path / "subnet.env"
    assert main(["check", f"--subnet-file={missing}"]) == 1
    assert capsys.readouterr() == ("", f"flannelctl check: {missing}: missing: is flanneld "
                                       "running on this node? run flannelctl doctor\n")
    assert main(["check", "--json", f"--subnet-file={missing}"]) == 1
    assert json.loads(capsys.readouterr().out) == {
        "ok": False, "peers": [],
        "error": f"{missing}: missing: is flanneld running on this node? run flannelctl doctor",
        "store": "etcd http://127.0.0.1:4001,http://127.0.0.1:2379, prefix /coreos.com/network, "
                 f"from the flags given; subnet.env {missing}"}


def test_plan_decides_what_needs_no_echo():

    from flannel.config import parse_config
    from flannel.ops.check import plan
    from flannel.ops.checks import Context
    from flannel.ops.leases import LeaseRow
    from flannel.ops.plans import describe as describe_leases

    def lease(subnet: str, public: str | None, backend: str, data: str | None = None,
              etcd_lease: int = 5) -> LeaseRow:
        made = Lease(IPv4Network(subnet), attrs=LeaseAttrs(
            IPv4Address(public) if public else None, backend_type=backend,
            backend_data=data), etcd_lease_id=etcd_lease)
        return LeaseRow(made.key, made)

    def mac(last: int) -> str:
        return f'{{"VNI":1,"VtepMAC":"f6:be:b0:e3:fd:{last:02x}"}}'

    config = parse_config('{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}')
    ctx = Context(Path("subnet.env"), Path("/proc/sys"), [], [], 1.0, False,
                  env={"FLANNEL_SUBNET": "10.244.1.1/24"}, config=config,
                  rows=[lease("10.244.1.0/24", "192.168.111.11", "vxlan", mac(1)),  # this node
                        lease("10.244.2.0/24", "192.168.111.12", "vxlan", mac(0x1c)),
                        lease("10.244.3.0/24", "192.168.111.13", "vxlan", mac(3)),
                        lease("10.244.4.0/24", "192.168.111.14", "host-gw"),
                        lease("10.244.5.0/24", "192.168.111.15", "vxlan"),  # no VTEP MAC
                        lease("10.244.6.0/24", "192.168.111.16", "", etcd_lease=0),
                        lease("10.99.7.0/24", "192.168.111.17", "vxlan", mac(7))])
    node = NodeView(config, ctx.own_lease, {"flannel.1": 7}, 2, IPv4Address("192.168.111.11"))
    description = describe_leases(VxlanBackend, node, ctx.leases)
    route = Route("10.244.2.0/24", "10.244.2.0", 7, onlink=True)
    kernel = KernelEntries({route.dst: (route, 151)},
                           {(7, "10.244.2.0"): Neighbour(7, "10.244.2.0", "f6:be:b0:e3:fd:1c")},
                           frozenset({FdbEntry(7, "f6:be:b0:e3:fd:1c", "192.168.111.12")}),
                           {7: "flannel.1"})
    probe, decided = plan(ctx, description, kernel, None)
    assert [(row.subnet.exploded, row.target) for row in probe] == [
        ("10.244.2.0/24", "10.244.2.0")]
    # The reservation no node has taken (10.244.6.0) is no row.
    assert [(row.subnet.exploded, row.verdict, row.detail) for row in decided] == [
        ("10.244.3.0/24", "not-programmed", "this node lacks what flanneld makes for it: no "
         "route to 10.244.3.0/24 (node 192.168.111.13)"),
        ("10.244.4.0/24", "skipped", "skipped by flanneld: its node runs the host-gw backend, "
         "which this node's vxlan backend cannot reach; every node of a network must run the "
         "same backend"),
        ("10.244.5.0/24", "skipped", "skipped by flanneld: its IPv4 backend data has no valid "
         "VtepMAC (a vxlan lease needs {\"VtepMAC\":\"<6-byte MAC>\"}); the node that owns it "
         "rewrites it on restart, or delete the lease"),
        ("10.99.7.0/24", "skipped", "skipped by flanneld: subnet 10.99.7.0/24 lies outside the "
         "Network 10.244.0.0/16")]


@pytest.mark.parametrize(("max_age", "given"), [(None, []), (0.0, ["--max-age=0"]),
                                                 (12.5, ["--max-age=12.5"])])
def test_check_lab_hands_each_node_the_max_age_it_was_given(max_age, given):
    from flannel.ctl import build_parser, ops_options
    from flannel.ops.checklab import node_command

    flags = [] if max_age is None else [f"--max-age={max_age:g}"]
    options = ops_options(build_parser().parse_args(["check", "--lab", "l1", *flags]), {})
    node = LabNode(1, "lab-n1", "192.0.2.1", "/run/lab/n1/subnet.env")
    argv = node_command(node, "http://192.0.2.254:2379", options)  # type: ignore[arg-type]
    assert [arg for arg in argv if arg.startswith("--max-age")] == given
