"""Kernel WireGuard over generic netlink, at the message level (this kernel has no WireGuard).

Every expected request and every kernel reply here is written field by field with ``struct``
from the layout of the kernel's include/uapi/linux/wireguard.h and linux/netlink.h (the
numbers are spelled out below, not imported), never produced by the encoder under test.
``KernelDouble`` stands for the kernel's end of the socket: it records each request and
answers it with the datagrams a test scripted, numbered with the request's sequence number.
"""

from __future__ import annotations

import base64
import errno
import socket
import struct
from collections.abc import Callable
from ipaddress import ip_address, ip_network

import pytest

from flannel.wireguard import genl
from flannel.wireguard.keys import Secret
from flannel.wireguard.peers import WireguardPeers
from flannel.wireguard.uapi import (
    ControlError,
    ControlUnavailable,
    DeviceUpdate,
    Peer,
    PeerUpdate,
    decode_get,
)

# linux/netlink.h, linux/genetlink.h
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK, NLM_F_DUMP_INTR, NLM_F_DUMP = 1, 2, 4, 0x10, 0x300
NLM_F_CAPPED = 0x100
NLA_F_NESTED = 0x8000
GENL_ID_CTRL, CTRL_CMD_NEWFAMILY, CTRL_CMD_GETFAMILY = 0x10, 1, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME, CTRL_ATTR_VERSION = 1, 2, 3
CTRL_ATTR_HDRSIZE, CTRL_ATTR_MAXATTR, CTRL_ATTR_OPS = 4, 5, 6
CTRL_ATTR_OP_ID, CTRL_ATTR_OP_FLAGS = 1, 2
# linux/wireguard.h
WG_CMD_GET_DEVICE, WG_CMD_SET_DEVICE = 0, 1
D_IFINDEX, D_IFNAME, D_PRIVATE_KEY, D_PUBLIC_KEY, D_FLAGS, D_LISTEN_PORT, D_FWMARK, D_PEERS = \
    1, 2, 3, 4, 5, 6, 7, 8
P_PUBLIC_KEY, P_PRESHARED_KEY, P_FLAGS, P_ENDPOINT, P_KEEPALIVE, P_HANDSHAKE = 1, 2, 3, 4, 5, 6
P_RX, P_TX, P_ALLOWEDIPS, P_PROTOCOL_VERSION = 7, 8, 9, 10
A_FAMILY, A_IPADDR, A_CIDR = 1, 2, 3
F_REMOVE_ME, F_REPLACE_ALLOWEDIPS, F_UPDATE_ONLY = 1, 2, 4

FAMILY = 0x1D  # what nlctrl gives wireguard on a typical kernel
IFNAME = "flannel-wg"
PRIV = Secret(bytes(range(32)))
PSK = Secret(bytes(range(32, 64)))
PUB_RAW = bytes(range(64, 96))
PUB = base64.b64encode(PUB_RAW).decode()
PUB2_RAW = bytes(range(96, 128))
PUB2 = base64.b64encode(PUB2_RAW).decode()
PUB3_RAW = bytes([7]) * 32
PUB3 = base64.b64encode(PUB3_RAW).decode()


# -- the layout, written out ---------------------------------------------------------------

def nla(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + bytes(-length % 4)


def nest(kind: int, *children: bytes) -> bytes:
    return nla(kind | NLA_F_NESTED, b"".join(children))


def u8(v: int) -> bytes:
    return struct.pack("=B", v)


def u16(v: int) -> bytes:
    return struct.pack("=H", v)


def u32(v: int) -> bytes:
    return struct.pack("=I", v)


def u64(v: int) -> bytes:
    return struct.pack("=Q", v)


def nlmsg(kind: int, flags: int, seq: int, payload: bytes, port: int = 0) -> bytes:
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, port) + payload


def genlhdr(cmd: int, version: int = 1) -> bytes:
    return struct.pack("=BBH", cmd, version, 0)


def sockaddr_in(addr: str, port: int) -> bytes:
    return u16(socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(addr) + bytes(8)


def sockaddr_in6(addr: str, port: int) -> bytes:
    return (u16(socket.AF_INET6) + struct.pack("!H", port) + u32(0)
            + socket.inet_pton(socket.AF_INET6, addr) + u32(0))


def allowed_ip_set(net: str) -> bytes:
    """One allowed IP as ``wg`` sends it: family, address, prefix length."""
    n = ip_network(net)
    family = socket.AF_INET if n.version == 4 else socket.AF_INET6
    return nest(0, nla(A_FAMILY, u16(family)), nla(A_IPADDR, n.network_address.packed),
                nla(A_CIDR, u8(n.prefixlen)))


def allowed_ip_dumped(net: str) -> bytes:
    """One allowed IP as the kernel dumps it: prefix length, family, address."""
    n = ip_network(net, strict=False)
    family = socket.AF_INET if n.version == 4 else socket.AF_INET6
    addr = ip_address(net.split("/")[0]).packed
    return nest(0, nla(A_CIDR, u8(n.prefixlen)), nla(A_FAMILY, u16(family)),
                nla(A_IPADDR, addr))


def error(seq: int, code: int, request_type: int = FAMILY) -> bytes:
    """An NLMSG_ERROR (an ACK when ``code`` is 0), capped: the request's header only."""
    return nlmsg(NLMSG_ERROR, NLM_F_CAPPED, seq,
                 struct.pack("=i", -code) + struct.pack("=IHHII", 40, request_type, 5, seq, 9))


def family_reply(seq: int, family: int = FAMILY) -> list[bytes]:
    body = (genlhdr(CTRL_CMD_NEWFAMILY, 2) + nla(CTRL_ATTR_FAMILY_NAME, b"wireguard\0")
            + nla(CTRL_ATTR_FAMILY_ID, u16(family)) + nla(CTRL_ATTR_VERSION, u32(1))
            + nla(CTRL_ATTR_HDRSIZE, u32(0)) + nla(CTRL_ATTR_MAXATTR, u32(8))
            + nest(CTRL_ATTR_OPS,
                   nest(1, nla(CTRL_ATTR_OP_ID, u32(0)), nla(CTRL_ATTR_OP_FLAGS, u32(0x1c))),
                   nest(2, nla(CTRL_ATTR_OP_ID, u32(1)), nla(CTRL_ATTR_OP_FLAGS, u32(0x1b)))))
    return [nlmsg(GENL_ID_CTRL, 0, seq, body, 9), error(seq, 0, GENL_ID_CTRL)]


Answer = Callable[[int], list[bytes]]


class KernelDouble:
    """The kernel's end of one netlink socket: each request is recorded and answered by the
    next scripted answer (datagrams built for the request's sequence number)."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.datagrams: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.requests.append(data)
        self.datagrams.extend(self.answers.pop(0)(struct.unpack_from("=I", data, 8)[0]))

    def recv(self, _size: int) -> bytes:
        return self.datagrams.pop(0)

    def close(self) -> None:
        pass

    def control(self) -> genl.GenlControl:
        return genl.GenlControl(IFNAME, connect=lambda: genl.GenlSocket(self))


def resolved(kernel: KernelDouble) -> genl.GenlControl:
    """A control whose family id is already known (its first call resolved it)."""
    control = kernel.control()
    kernel.answers.insert(0, family_reply)
    kernel.answers.insert(1, lambda seq: [nlmsg(NLMSG_DONE, NLM_F_MULTI, seq, u32(0))])
    control.get()
    kernel.requests.clear()
    return control


# -- requests -------------------------------------------------------------------------------

def test_the_family_is_asked_of_nlctrl_by_name_and_read_from_its_reply():
    kernel = KernelDouble(family_reply, lambda seq: [nlmsg(NLMSG_DONE, NLM_F_MULTI, seq, u32(0))])
    kernel.control().get()
    assert kernel.requests[0] == nlmsg(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, 1,
                                       genlhdr(CTRL_CMD_GETFAMILY) + nla(CTRL_ATTR_FAMILY_NAME,
                                                                         b"wireguard\0"))
    # The dump that follows goes to the id nlctrl answered.
    assert kernel.requests[1] == nlmsg(FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 2,
                                       genlhdr(WG_CMD_GET_DEVICE) + nla(D_IFNAME,
                                                                        b"flannel-wg\0"))


def test_a_new_peer_is_sent_in_full_with_the_device_fields():
    update = DeviceUpdate(private_key=PRIV, listen_port=51820, peers=(PeerUpdate(
        PUB, endpoint="192.168.1.2:51820", psk=PSK, set_psk=True, keepalive=25,
        allowed_ips=frozenset({"10.5.2.0/24", "fd00:5:2::/64"})),))
    peer = nest(0, nla(P_PUBLIC_KEY, PUB_RAW), nla(P_FLAGS, u32(F_REPLACE_ALLOWEDIPS)),
                nla(P_PRESHARED_KEY, PSK.raw),
                nla(P_ENDPOINT, sockaddr_in("192.168.1.2", 51820)),
                nla(P_KEEPALIVE, u16(25)),
                nest(P_ALLOWEDIPS, allowed_ip_set("10.5.2.0/24"),
                     allowed_ip_set("fd00:5:2::/64")))
    expected = nlmsg(FAMILY, NLM_F_REQUEST | NLM_F_ACK, 7, genlhdr(WG_CMD_SET_DEVICE)
                     + nla(D_IFNAME, b"flannel-wg\0") + nla(D_PRIVATE_KEY, PRIV.raw)
                     + nla(D_LISTEN_PORT, u16(51820)) + nest(D_PEERS, peer))
    assert genl.encode_set_device(FAMILY, IFNAME, update, 7) == [expected]


def test_field_fixes_psk_clearing_and_removals():
    update = DeviceUpdate(peers=(
        PeerUpdate(PUB, update_only=True, endpoint="[fd00:0::2]:51821"),
        PeerUpdate(PUB2, update_only=True, set_psk=True, keepalive=0,
                   allowed_ips=frozenset()),
        PeerUpdate(PUB3, remove=True, endpoint="ignored:1")))
    peers = nest(
        D_PEERS,
        nest(0, nla(P_PUBLIC_KEY, PUB_RAW), nla(P_FLAGS, u32(F_UPDATE_ONLY)),
             nla(P_ENDPOINT, sockaddr_in6("fd00::2", 51821))),
        # A zero key clears the PSK; an empty replacement clears the allowed IPs.
        nest(0, nla(P_PUBLIC_KEY, PUB2_RAW),
             nla(P_FLAGS, u32(F_UPDATE_ONLY | F_REPLACE_ALLOWEDIPS)),
             nla(P_PRESHARED_KEY, bytes(32)), nla(P_KEEPALIVE, u16(0))),
        nest(0, nla(P_PUBLIC_KEY, PUB3_RAW), nla(P_FLAGS, u32(F_REMOVE_ME))))
    assert genl.encode_set_device(FAMILY, IFNAME, update, 1) == [nlmsg(
        FAMILY, NLM_F_REQUEST | NLM_F_ACK, 1,
        genlhdr(WG_CMD_SET_DEVICE) + nla(D_IFNAME, b"flannel-wg\0") + peers)]


def walk(data: bytes, offset: int = 0) -> list[tuple[int, bytes]]:
    """(raw type with flags, payload) of each attribute, read independently of the code."""
    out = []
    while offset < len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        out.append((kind, data[offset + 4: offset + length]))
        offset += (length + 3) & ~3
    return out


def split_message(message: bytes) -> tuple[int, int, list[tuple[int, bytes]]]:
    length, kind, flags, seq, _port = struct.unpack_from("=IHHII", message)
    assert length == len(message) and kind == FAMILY and flags == NLM_F_REQUEST | NLM_F_ACK
    assert message[16:20] == genlhdr(WG_CMD_SET_DEVICE)
    return seq, length, walk(message, 20)


def test_many_peers_are_split_into_messages_the_kernel_takes():
    peers = tuple(PeerUpdate(base64.b64encode(bytes([n % 256, n // 256]) * 16).decode(),
                             endpoint=f"192.168.{n // 256}.{n % 256}:51820", psk=PSK,
                             keepalive=25, allowed_ips=frozenset({
                                 f"10.{n // 256}.{n % 256}.0/24",
                                 f"fd00:{n // 256}:{n % 256}::/64"}))
                  for n in range(1, 201))
    update = DeviceUpdate(private_key=PRIV, listen_port=51820, peers=peers)
    messages = genl.encode_set_device(FAMILY, IFNAME, update, 3)
    assert len(messages) > 1
    sent_peers: list[bytes] = []
    for index, message in enumerate(messages):
        seq, length, attrs = split_message(message)
        assert seq == 3 + index and length <= 4096
        kinds = [kind for kind, _ in attrs]
        # The device's own fields go once, in the first message; every message names it.
        assert kinds == ([D_IFNAME, D_PRIVATE_KEY, D_LISTEN_PORT, D_PEERS | NLA_F_NESTED]
                         if index == 0 else [D_IFNAME, D_PEERS | NLA_F_NESTED])
        sent_peers += [nla(kind, p) for kind, p in walk(attrs[-1][1])]
    # Every peer exactly once, in order, each whole.
    assert sent_peers == [nest(0, nla(P_PUBLIC_KEY, base64.b64decode(p.public_key)),
                               nla(P_FLAGS, u32(F_REPLACE_ALLOWEDIPS)),
                               nla(P_PRESHARED_KEY, PSK.raw),
                               nla(P_ENDPOINT, sockaddr_in(p.endpoint.split(":")[0], 51820)),
                               nla(P_KEEPALIVE, u16(25)),
                               nest(P_ALLOWEDIPS, *(allowed_ip_set(n)
                                                    for n in sorted(p.allowed_ips))))
                          for p in peers]


def test_a_peer_with_more_allowed_ips_than_fit_is_continued_without_replacing():
    nets = [f"10.{n // 256}.{n % 256}.0/24" for n in range(150)] + [
        f"fd00:{n}::/64" for n in range(150)]
    update = DeviceUpdate(peers=(PeerUpdate(PUB, endpoint="192.168.1.2:51820",
                                            allowed_ips=frozenset(nets)),))
    messages = genl.encode_set_device(FAMILY, IFNAME, update, 1)
    assert len(messages) >= 3
    seen: list[bytes] = []
    for index, message in enumerate(messages):
        _seq, length, attrs = split_message(message)
        assert length <= 4096
        ((peer_kind, peer),) = walk(attrs[-1][1])
        assert peer_kind == NLA_F_NESTED
        fields = dict(walk(peer))
        assert fields[P_PUBLIC_KEY] == PUB_RAW
        if index == 0:
            # The first part replaces the peer's list and carries its other fields...
            assert fields[P_FLAGS] == u32(F_REPLACE_ALLOWEDIPS) and P_ENDPOINT in fields
        else:
            # ...the others only add to it, and never create the peer.
            assert fields[P_FLAGS] == u32(F_UPDATE_ONLY)
            assert set(fields) == {P_PUBLIC_KEY, P_FLAGS, P_ALLOWEDIPS | NLA_F_NESTED}
        seen += [nla(kind, entry) for kind, entry in walk(fields[P_ALLOWEDIPS | NLA_F_NESTED])]
    assert seen == [allowed_ip_set(n) for n in sorted(nets)]


# -- replies --------------------------------------------------------------------------------

def dumped_peer(key: bytes, *, psk: bytes = bytes(32), handshake: tuple[int, int] = (0, 0),
                keepalive: int = 0, rx: int = 0, tx: int = 0, endpoint: bytes | None = None,
                nets: tuple[str, ...] = ()) -> bytes:
    """A peer's first part as the kernel writes it (with the 64-bit alignment pad some
    architectures put before the byte counters)."""
    attrs = [nla(P_PUBLIC_KEY, key), nla(P_PRESHARED_KEY, psk),
             nla(P_HANDSHAKE, struct.pack("=qq", *handshake)), nla(P_KEEPALIVE, u16(keepalive)),
             nla(0, b""), nla(P_TX, u64(tx)), nla(P_RX, u64(rx)),
             nla(P_PROTOCOL_VERSION, u32(1))]
    if endpoint is not None:
        attrs.append(nla(P_ENDPOINT, endpoint))
    if nets:
        attrs.append(nest(P_ALLOWEDIPS, *(allowed_ip_dumped(n) for n in nets)))
    return nest(0, *attrs)


def device_fields() -> bytes:
    return (nla(D_LISTEN_PORT, u16(51820)) + nla(D_FWMARK, u32(0)) + nla(D_IFINDEX, u32(5))
            + nla(D_IFNAME, b"flannel-wg\0") + nla(D_PRIVATE_KEY, PRIV.raw)
            + nla(D_PUBLIC_KEY, bytes([42]) * 32))


def dump(*bodies: bytes, flags: int = NLM_F_MULTI) -> Answer:
    """A GET_DEVICE dump: one datagram per message, then NLMSG_DONE."""
    return lambda seq: [*(nlmsg(FAMILY, flags, seq, genlhdr(WG_CMD_GET_DEVICE) + body, 9)
                          for body in bodies),
                        nlmsg(NLMSG_DONE, NLM_F_MULTI, seq, u32(0), 9)]


# Three peers over two messages; the second peer's allowed IPs continue in the second.
FIRST = device_fields() + nest(D_PEERS, dumped_peer(
    PUB_RAW, psk=PSK.raw, handshake=(1700000000, 500000000), keepalive=25, rx=20, tx=10,
    endpoint=sockaddr_in("192.168.1.2", 51820), nets=("10.5.2.0/24", "fd00:5:2::/64")),
    dumped_peer(PUB2_RAW, endpoint=sockaddr_in6("fd00::3", 51821), nets=("10.5.3.0/24",)))
SECOND = nest(D_PEERS, nest(0, nla(P_PUBLIC_KEY, PUB2_RAW),
                            nest(P_ALLOWEDIPS, allowed_ip_dumped("fd00:5:3::/64"))),
              dumped_peer(PUB3_RAW))
# The same device as wireguard-go answers it over UAPI.
SAME_OVER_UAPI = (
    f"private_key={PRIV.hex()}\nlisten_port=51820\n"
    f"public_key={PUB_RAW.hex()}\npreshared_key={PSK.hex()}\nprotocol_version=1\n"
    "endpoint=192.168.1.2:51820\nlast_handshake_time_sec=1700000000\n"
    "last_handshake_time_nsec=500000000\ntx_bytes=10\nrx_bytes=20\n"
    "persistent_keepalive_interval=25\nallowed_ip=10.5.2.0/24\nallowed_ip=fd00:5:2::/64\n"
    f"public_key={PUB2_RAW.hex()}\npreshared_key={'0' * 64}\nprotocol_version=1\n"
    "endpoint=[fd00::3]:51821\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
    "tx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=0\nallowed_ip=10.5.3.0/24\n"
    "allowed_ip=fd00:5:3::/64\n"
    f"public_key={PUB3_RAW.hex()}\npreshared_key={'0' * 64}\nprotocol_version=1\n"
    "last_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\n"
    "persistent_keepalive_interval=0\n")


def test_a_multipart_dump_reads_as_the_same_state_as_uapi():
    kernel = KernelDouble(family_reply, dump(FIRST, SECOND))
    state = kernel.control().get()
    assert state == decode_get(SAME_OVER_UAPI)
    assert state.peers[PUB2].peer == Peer(
        PUB2, "[fd00::3]:51821", frozenset({"10.5.3.0/24", "fd00:5:3::/64"}), None, 0)
    assert state.peers[PUB].last_handshake == 1700000000.5
    assert state.peers[PUB3].peer.allowed_ips == frozenset()


def test_a_dump_the_kernel_flags_as_interrupted_is_read_again():
    changed = nest(D_PEERS, dumped_peer(PUB_RAW, nets=("10.5.9.0/24",)))
    kernel = KernelDouble(family_reply, dump(device_fields() + changed, flags=NLM_F_MULTI
                                             | NLM_F_DUMP_INTR), dump(FIRST, SECOND))
    assert kernel.control().get() == decode_get(SAME_OVER_UAPI)
    assert len(kernel.requests) == 3


def test_a_device_that_keeps_changing_is_an_error_not_a_loop():
    control = resolved(kernel := KernelDouble())
    kernel.answers += [dump(FIRST, flags=NLM_F_MULTI | NLM_F_DUMP_INTR)] * 5
    with pytest.raises(ControlError) as err:
        control.get()
    assert str(err.value) == ("flannel-wg changed during each of 5 reads; something else "
                              "keeps reconfiguring it")


@pytest.mark.parametrize("body", [
    nest(D_PEERS, nest(0, nla(P_PRESHARED_KEY, bytes(32)))),  # a peer without its key
    nest(D_PEERS, dumped_peer(PUB_RAW, endpoint=u16(socket.AF_INET))),
    nest(D_PEERS, nest(0, nla(P_PUBLIC_KEY, PUB_RAW), nest(P_ALLOWEDIPS, nest(
        0, nla(A_CIDR, u8(33)), nla(A_FAMILY, u16(socket.AF_INET)),
        nla(A_IPADDR, bytes(4)))))),
    struct.pack("=HH", 200, D_LISTEN_PORT) + u16(1),  # an attribute past the message
])
def test_unreadable_replies_are_errors_without_their_content(body):
    control = resolved(kernel := KernelDouble())
    kernel.answers.append(dump(body))
    with pytest.raises(ControlError) as err:
        control.get()
    assert str(err.value).startswith("the kernel answered")
    assert PUB not in str(err.value)


# -- errors, as the backend shows them ------------------------------------------------------

def refuse(code: int) -> Answer:
    return lambda seq: [error(seq, code)]


def test_no_wireguard_family_names_the_module():
    kernel = KernelDouble(lambda seq: [error(seq, errno.ENOENT, GENL_ID_CTRL)])
    with pytest.raises(ControlError) as err:
        kernel.control().get()
    assert not isinstance(err.value, ControlUnavailable)
    assert str(err.value) == ('this kernel has no WireGuard (generic netlink has no '
                              '"wireguard" family); load the wireguard module '
                              '(`modprobe wireguard`)')


def test_a_missing_device_is_unavailable_so_the_device_is_brought_back():
    control = resolved(kernel := KernelDouble())
    kernel.answers.append(refuse(errno.ENODEV))
    with pytest.raises(ControlUnavailable) as err:
        control.get()
    assert str(err.value) == "flannel-wg does not exist in this host"


def test_permission_and_port_refusals_name_the_fix_and_no_key():
    control = resolved(kernel := KernelDouble())
    kernel.answers += [refuse(errno.EPERM), refuse(errno.EADDRINUSE)]
    update = DeviceUpdate(private_key=PRIV, listen_port=51820)
    with pytest.raises(ControlError) as err:
        control.set(update)
    assert str(err.value) == (
        "the kernel refused flanneld access to flannel-wg (EPERM): reading or configuring "
        "WireGuard needs CAP_NET_ADMIN in this network namespace; run flanneld as root or "
        "grant it NET_ADMIN (the DaemonSet's securityContext)")
    with pytest.raises(ControlError) as err:
        control.set(update)
    assert str(err.value) == (
        "flannel-wg cannot listen on UDP port 51820: another socket holds it; stop that "
        "program or set another ListenPort in the backend config")
    assert PRIV.hex() not in str(err.value) and PRIV.base64() not in str(err.value)


def test_a_reloaded_module_is_resolved_again():
    control = resolved(kernel := KernelDouble())
    kernel.answers += [refuse(errno.ENOENT), lambda seq: family_reply(seq, 0x22),
                       dump(FIRST, SECOND)]
    with pytest.raises(ControlUnavailable):
        control.get()
    assert control.get() == decode_get(SAME_OVER_UAPI)
    assert struct.unpack_from("=H", kernel.requests[-1], 4)[0] == 0x22


class Device:
    """What the peer reconciler needs of a device: a name, a control and ``ensure``."""

    def __init__(self, control: genl.GenlControl) -> None:
        self.name = IFNAME
        self.control = control
        self.ensured = 0

    def ensure(self) -> None:
        self.ensured += 1


def test_the_peer_reconciler_reports_the_refusal_and_recreates_a_vanished_device():
    control = resolved(kernel := KernelDouble())
    desired = [Peer(PUB3, None, frozenset(), None, 0)]
    device = Device(control)
    peers = WireguardPeers(device)  # type: ignore[arg-type]
    # The device vanished: it is brought back, read again, and its peers set.
    added = nest(D_PEERS, dumped_peer(PUB3_RAW))
    kernel.answers += [refuse(errno.ENODEV), dump(device_fields()), lambda seq: [error(seq, 0)],
                       dump(device_fields() + added)]
    status = peers.reconcile(desired)
    assert status.in_sync and device.ensured == 1 and status.changes == 1
    # A refusal is the pass's error, as the data plane reports it.
    kernel.answers += [dump(device_fields()), refuse(errno.EPERM)]
    status = peers.reconcile(desired)
    assert not status.in_sync and "needs CAP_NET_ADMIN" in status.last_error


def test_a_failing_socket_is_a_control_error_not_a_crash():
    control = resolved(kernel := KernelDouble())

    def overrun(_size: int) -> bytes:
        raise OSError(errno.ENOBUFS, "No buffer space available")

    kernel.answers.append(lambda seq: [])
    kernel.recv = overrun  # type: ignore[method-assign]
    with pytest.raises(ControlError) as err:
        control.get()
    assert str(err.value) == "flannel-wg: generic netlink socket: No buffer space available"


def test_a_dump_of_more_peers_than_the_bound_is_refused(monkeypatch):
    monkeypatch.setattr(genl, "MAX_PEERS", 3)
    peers = b"".join(nest(0, nla(P_PUBLIC_KEY, bytes([n]) * 32)) for n in range(1, 5))
    body = genlhdr(WG_CMD_GET_DEVICE) + nest(D_PEERS, peers)
    with pytest.raises(ControlError, match="the kernel answered more than 3 peers"):
        genl.decode_get_device([body])


def test_a_dump_that_never_ends_is_cut(monkeypatch):
    """Datagrams for another request, forever: the reply's deadline ends the wait."""
    monkeypatch.setattr(genl, "REPLY_TIMEOUT", 0.3)

    class Endless(KernelDouble):
        def recv(self, _size: int) -> bytes:
            return nlmsg(FAMILY, NLM_F_MULTI, 999, genlhdr(WG_CMD_GET_DEVICE))

    control = resolved(KernelDouble())
    control._connect = lambda: genl.GenlSocket(Endless(lambda seq: []))
    with pytest.raises(ControlError, match=r"the kernel's answer took more than 0.3s"):
        control.get()
