"""The UAPI text protocol: what we send on set=1 and how we read get=1."""

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flannel.wireguard import uapi
from flannel.wireguard.keys import Secret
from flannel.wireguard.uapi import (
    ControlError,
    DeviceUpdate,
    Peer,
    PeerUpdate,
    UapiControl,
    _split_errno,
    decode_get,
    encode_set,
    normalise_endpoint,
)
from tests.support.fuzzing import examples

PRIV = Secret(bytes(range(32)))
PSK = Secret(bytes(range(32, 64)))
PUB_RAW = bytes(range(64, 96))
PUB = base64.b64encode(PUB_RAW).decode()


def test_a_new_peer_is_sent_in_full():
    update = DeviceUpdate(private_key=PRIV, listen_port=51820, peers=(PeerUpdate(
        PUB, endpoint="192.168.1.2:51820", psk=PSK, set_psk=True, keepalive=25,
        allowed_ips=frozenset({"10.5.2.0/24", "fd00:5:2::/64"})),))
    assert encode_set(update).decode() == (
        "set=1\n"
        f"private_key={bytes(range(32)).hex()}\n"
        "listen_port=51820\n"
        f"public_key={PUB_RAW.hex()}\n"
        f"preshared_key={bytes(range(32, 64)).hex()}\n"
        "endpoint=192.168.1.2:51820\n"
        "persistent_keepalive_interval=25\n"
        "replace_allowed_ips=true\n"
        "allowed_ip=10.5.2.0/24\n"
        "allowed_ip=fd00:5:2::/64\n"
        "\n")


def test_field_fixes_removals_and_psk_clearing():
    update = DeviceUpdate(peers=(
        PeerUpdate(PUB, update_only=True, set_psk=True),
        PeerUpdate(PUB, update_only=True, endpoint="[fd00::2]:51821"),
        PeerUpdate(PUB, remove=True, endpoint="ignored:1")))
    assert encode_set(update).decode() == (
        "set=1\n"
        f"public_key={PUB_RAW.hex()}\nupdate_only=true\npreshared_key={'0' * 64}\n"
        f"public_key={PUB_RAW.hex()}\nupdate_only=true\nendpoint=[fd00::2]:51821\n"
        f"public_key={PUB_RAW.hex()}\nremove=true\n"
        "\n")


GET_ANSWER = (
    f"private_key={bytes(range(32)).hex()}\n"
    "listen_port=51820\n"
    f"public_key={PUB_RAW.hex()}\n"
    f"preshared_key={'0' * 64}\n"
    "protocol_version=1\n"
    "endpoint=[fd00:0::2]:51821\n"
    "last_handshake_time_sec=1700000000\n"
    "last_handshake_time_nsec=500000000\n"
    "tx_bytes=10\nrx_bytes=20\n"
    "persistent_keepalive_interval=0\n"
    "allowed_ip=10.5.2.7/24\n"
    "allowed_ip=fd00:5:2::/64\n"
    f"public_key={bytes(range(96, 128)).hex()}\n"
    f"preshared_key={bytes(range(32, 64)).hex()}\n"
    "last_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
    "persistent_keepalive_interval=25\n")


def test_get_answers_are_decoded_and_normalised():
    state = decode_get(GET_ANSWER)
    assert state.private_key == PRIV and state.listen_port == 51820
    first = state.peers[PUB]
    assert first.peer == Peer(PUB, "[fd00::2]:51821",
                              frozenset({"10.5.2.0/24", "fd00:5:2::/64"}), None, 0)
    assert first.last_handshake == 1700000000.5 and (first.rx_bytes, first.tx_bytes) == (20, 10)
    second = state.peers[base64.b64encode(bytes(range(96, 128))).decode()]
    assert second.peer.psk == PSK and second.peer.endpoint is None
    assert second.last_handshake is None and second.peer.keepalive == 25


@pytest.mark.parametrize("answer", ["garbage", "public_key=zz\n", "public_key=00\n",
                                    f"public_key={PUB_RAW.hex()}\nrx_bytes=many\n",
                                    f"private_key={'ab' * 31}\n"])
def test_unreadable_answers_are_errors_without_their_content(answer):
    with pytest.raises(ControlError) as err:
        decode_get(answer)
    assert PUB_RAW.hex() not in str(err.value)


def test_the_errno_line_ends_every_answer():
    assert _split_errno("listen_port=1\nerrno=0\n\n") == ("listen_port=1", 0)
    assert _split_errno("errno=22\n\n") == ("", 22)
    for bad in ("listen_port=1\n\n", "errno=x\n\n"):
        with pytest.raises(ControlError):
            _split_errno(bad)


@pytest.mark.parametrize(("text", "canonical"), [
    ("192.168.1.2:51820", "192.168.1.2:51820"),
    ("[fd00:0:0::1]:51821", "[fd00::1]:51821"),
    ("[::ffff:1.2.3.4]:1", "[::ffff:102:304]:1"),
    ("192.168.1.2", None), ("192.168.1.2:0", None), ("host:80", None), ("", None),
    (None, None), ("1.2.3.4:99999", None),
])
def test_endpoints_are_compared_in_canonical_form(text, canonical):
    assert normalise_endpoint(text) == canonical


_KEYS = ["private_key", "listen_port", "public_key", "preshared_key", "endpoint",
         "allowed_ip", "last_handshake_time_sec", "last_handshake_time_nsec", "rx_bytes",
         "tx_bytes", "persistent_keepalive_interval", "protocol_version", "errno", "x"]
_VALUES = st.one_of(st.text(max_size=70), st.just(PUB_RAW.hex()), st.just("10.5.2.0/24"),
                    st.just("[fd00::1]:1"), st.integers(-5, 2**70).map(str))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KEYS), _VALUES), max_size=12))
def test_any_get_answer_is_decoded_or_refused_as_a_control_error(lines):
    text = "\n".join(f"{key}={value}" for key, value in lines)
    try:
        decode_get(text)
    except ControlError:
        pass


def _peer_lines(count: int, allowed: int = 1) -> str:
    return "".join(f"public_key={n:064x}\n" + "allowed_ip=10.5.0.0/24\n" * allowed
                   for n in range(1, count + 1))


def test_an_answer_of_more_peers_or_allowed_ips_than_the_bounds_is_refused():
    assert len(decode_get(_peer_lines(3, allowed=2)).peers) == 3
    with pytest.raises(ControlError, match=f"more than {uapi.MAX_PEERS} peers"):
        decode_get(_peer_lines(uapi.MAX_PEERS + 1))
    with pytest.raises(ControlError, match=f"more than {uapi.MAX_ALLOWED_IPS} allowed IPs"):
        decode_get(_peer_lines(1, allowed=uapi.MAX_ALLOWED_IPS + 1))


def test_an_answer_dripping_a_byte_at_a_time_is_cut_at_the_deadline(tmp_path):
    """wireguard-go's socket answering a byte every 0.2 s: every read gets a byte in time,
    the answer as a whole does not."""
    import socket
    import threading
    import time

    path = tmp_path / "flannel-wg.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def drip() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            for byte in b"listen_port=51820\nerrno=0\n\n":
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(ControlError, match="did not answer within 1s"):
            UapiControl(path, timeout=1.0).get()
        # Not a speed bound: a deadline per read would wait out the whole drip (5.4 s).
        assert time.monotonic() - started < 4
    finally:
        thread.join(10)
        server.close()
