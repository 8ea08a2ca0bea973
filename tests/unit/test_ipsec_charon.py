"""What flanneld asks of charon before it runs one: the strongswan.conf it writes (the
system's included, a log with connection names, kernel-libipsec only where asked), where it
looks for charon and what it says when there is none, which running process it calls
its own (the marker's pid must be a charon started with flanneld's config), how a VICI
session that fails comes out (a CharonError, whatever failed) and how cleanup stops a charon
that ignores SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from vici.protocol import Message

from flannel.ipsec import charon
from flannel.ipsec.charon import Charon, CharonError, CharonSpec
from tests.support.waiting import wait_until


def test_the_config_includes_the_systems_and_adds_a_log_with_connection_names(tmp_path):
    text = charon.config_text(tmp_path / "charon.log", libipsec=True)
    assert text.splitlines()[1] == "include /etc/strongswan.conf"
    assert f"path = {tmp_path / 'charon.log'}" in text and "ike_name = yes" in text
    assert "kernel-libipsec {\n      load = yes" in text
    assert "load = no" in charon.config_text(tmp_path / "charon.log", libipsec=False)


def test_charon_is_looked_for_where_go_looks_and_its_absence_says_what_to_install(
        monkeypatch, tmp_path):
    assert charon.SEARCH[:3] == ("charon", "/usr/lib/strongswan/charon", "/usr/lib/ipsec/charon")
    monkeypatch.setattr(charon, "SEARCH", (str(tmp_path / "charon"),))
    with pytest.raises(CharonError, match=r"no charon executable found at .*; install "
                       r"strongSwan's charon .*strongswan-charon libstrongswan-standard-plugins"):
        charon.find_charon()


def test_a_marker_naming_a_process_that_is_not_our_charon_is_not_ours(tmp_path):
    (tmp_path / "charon.pid").write_text(f"{os.getpid()}\n")  # a python, not a charon
    assert charon.our_pid(tmp_path) is None
    (tmp_path / "charon.pid").write_text("not a pid\n")
    assert charon.our_pid(tmp_path) is None
    (tmp_path / "charon.pid").unlink()
    assert charon.our_pid(tmp_path) is None
    os.mkfifo(tmp_path / "charon.pid")  # would block a reader that opened it for reading
    assert charon.our_pid(tmp_path) is None


def test_a_socket_nobody_serves_is_not_a_charon_and_a_session_says_where_it_looked(tmp_path):
    spec = CharonSpec(libipsec=True, socket_path=tmp_path / "charon.vici", state_dir=tmp_path)
    assert Charon(spec).answers() is False
    with pytest.raises(CharonError, match=f"charon does not answer on {tmp_path}/charon.vici"),\
            Charon(spec).session():
        pass


def test_the_log_is_read_by_whole_lines_from_where_the_last_read_ended(tmp_path):
    spec = CharonSpec(libipsec=True, state_dir=tmp_path)
    log = Charon(spec)
    spec.log_path.write_text("one\ntwo\nhalf")
    offset, lines = log.read_log(0)
    assert (offset, list(lines)) == (8, ["one", "two"])
    with open(spec.log_path, "a") as f:
        f.write(" done\n")
    assert list(log.read_log(offset)[1]) == ["half done"]
    spec.log_path.write_text("new\n")  # rewritten: read from its start
    assert list(log.read_log(offset)[1]) == ["new"]


def test_a_process_with_our_config_that_is_not_a_charon_is_not_ours(tmp_path):
    conf = tmp_path / "strongswan.conf"
    conf.write_text("charon {\n}\n")
    other = subprocess.Popen(["sleep", "30"], env={"STRONGSWAN_CONF": str(conf)})
    try:
        (tmp_path / "charon.pid").write_text(f"{other.pid}\n")
        assert charon.process_conf(other.pid) is None
        assert charon.our_pid(tmp_path) is None
    finally:
        other.kill()
        other.wait()


def test_a_charon_that_keeps_dying_is_started_again_later_each_time(monkeypatch, tmp_path):
    """A program standing for a charon that exits at once (status 3): each start fails with
    its status and log, and the next start waits 1 s, then 2 s, ..."""
    fake = tmp_path / "charon"
    fake.write_text("#!/bin/sh\necho 'no plugins found' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(charon, "SEARCH", (str(fake),))
    daemon = Charon(CharonSpec(libipsec=True, socket_path=tmp_path / "charon.vici",
                               state_dir=tmp_path / "state"))
    with pytest.raises(CharonError, match=r"charon exited with status 3 at start: "
                       r"no plugins found"):
        daemon.ensure()
    with pytest.raises(CharonError, match=r"starting it again in 1s"):
        daemon.ensure()

    def second_start_failed() -> bool:
        try:
            daemon.ensure()
        except CharonError as err:
            return "exited with status 3" in str(err)
        return False

    wait_until(second_start_failed, 5, interval=0.1, what="the second start")
    with pytest.raises(CharonError, match=r"starting it again in 2s"):
        daemon.ensure()
    assert oct((tmp_path / "state" / "strongswan.conf").stat().st_mode & 0o777) == "0o600"


def _serve_once(path, answer):
    """A VICI socket at ``path`` that reads one request and then does ``answer(conn)``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            length, = struct.unpack("!I", conn.recv(4))
            conn.recv(length)
            answer(conn)
            # Until the client closes; one that cut an answer short leaves it unread, and
            # its close then resets the connection.
            with contextlib.suppress(ConnectionResetError):
                conn.recv(1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server, thread


def _refuse(conn):
    packet = bytes([1]) + Message.serialize({"success": "no", "errmsg": "invalid proposal"})
    conn.sendall(struct.pack("!I", len(packet)) + packet)


@pytest.mark.parametrize(("answer", "cause"), [
    (_refuse, "Command failed: invalid proposal"),  # vici's CommandException
    (lambda conn: conn.shutdown(socket.SHUT_WR), "Connection closed"),  # charon died
    (lambda conn: None, "no reply within 0.2s"),  # charon hangs
])
def test_a_vici_request_that_fails_in_a_session_is_a_charon_error(monkeypatch, tmp_path,
                                                                  answer, cause):
    monkeypatch.setattr(charon, "REQUEST_TIMEOUT", 0.2)
    spec = CharonSpec(libipsec=False, socket_path=tmp_path / "charon.vici", state_dir=tmp_path)
    server, thread = _serve_once(spec.socket_path, answer)
    try:
        with pytest.raises(CharonError) as raised, Charon(spec).session() as vici:
            vici.load_conn({"peer": {"version": "2"}})
        assert str(raised.value) == (f"charon on {spec.socket_path} failed a request: {cause}")
    finally:
        thread.join(5)
        server.close()
    assert not thread.is_alive()


def test_a_charon_that_ignores_sigterm_is_killed_and_reported_stopped(tmp_path):
    """A program named charon started with a strongswan.conf (as flanneld starts charon)
    that traps SIGTERM: it needs SIGKILL, and stop waits for it to go."""
    fake = tmp_path / "charon"
    fake.symlink_to(sys.executable)  # the kernel names the process after the path run
    conf = tmp_path / "strongswan.conf"
    stubborn = subprocess.Popen(
        [str(fake), "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('ready', flush=True)\n"
         "time.sleep(60)\n"],
        env={"STRONGSWAN_CONF": str(conf)}, stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        (tmp_path / "charon.pid").write_text(f"{stubborn.pid}\n")
        assert charon.our_pid(tmp_path) == stubborn.pid
        assert charon.stop(stubborn.pid, timeout=0.3) is True
        assert stubborn.wait(5) == -signal.SIGKILL
        assert charon.our_pid(tmp_path) is None
    finally:
        stubborn.kill()
        stubborn.wait()
        if stubborn.stdout is not None:
            stubborn.stdout.close()


def _event(name: str, message: dict) -> bytes:
    body = bytes([7, len(name)]) + name.encode() + Message.serialize(message)
    return struct.pack("!I", len(body)) + body


def _stream(events):
    """A VICI socket's answers to one streamed request (register, request, unregister):
    ``events(conn)`` writes what comes between the confirmation and the response."""
    def answer(conn) -> None:
        confirm = struct.pack("!I", 1) + bytes([5])
        conn.sendall(confirm)  # the registration
        length, = struct.unpack("!I", conn.recv(4))
        conn.recv(length)  # the request
        events(conn)
        # What follows finds the client gone when it cut the stream.
        with contextlib.suppress(OSError, struct.error):
            done = bytes([1]) + Message.serialize({})
            conn.sendall(struct.pack("!I", len(done)) + done)
            length, = struct.unpack("!I", conn.recv(4))
            conn.recv(length)
            conn.sendall(confirm)  # the unregistration
    return answer


def _endless(conn) -> None:
    event = _event("list-sa", {"x": {"state": "ESTABLISHED"}})
    try:
        for _ in range(10 ** 6):
            conn.sendall(event)
    except OSError:
        pass


def _drip(conn) -> None:
    event = _event("list-sa", {"x": {"state": "ESTABLISHED"}})
    try:
        for byte in event:
            conn.sendall(bytes([byte]))
            time.sleep(0.1)
    except OSError:
        pass


@pytest.mark.parametrize(("events", "cause"), [
    pytest.param(lambda conn: conn.sendall(struct.pack("!I", 2 ** 32 - 1)),
                 "a message of 4294967295 bytes, over the limit of 65536; refusing the "
                 "answer", id="huge"),
    pytest.param(_endless, "more than 50 events for one request; refusing the answer",
                 id="endless"),
    pytest.param(_drip, "no reply within 0.5s", id="drip"),
])
def test_a_vici_answer_beyond_its_bounds_is_cut(monkeypatch, tmp_path, events, cause):
    monkeypatch.setattr(charon, "REQUEST_TIMEOUT", 0.5)
    monkeypatch.setattr(charon, "MAX_EVENTS", 50)
    spec = CharonSpec(libipsec=False, socket_path=tmp_path / "charon.vici", state_dir=tmp_path)
    server, thread = _serve_once(spec.socket_path, _stream(events))
    started = time.monotonic()
    try:
        with pytest.raises(CharonError) as raised, Charon(spec).session() as vici:
            charon.sa_states(vici)
        assert str(raised.value) == f"charon on {spec.socket_path} failed a request: {cause}"
        assert time.monotonic() - started < 3
    finally:
        thread.join(5)
        server.close()
    assert not thread.is_alive()


def _slow_drip(conn) -> None:
    """Events a byte every 0.5 s: each byte well within a request's timeout, the stream
    within its 120 s only after a minute or more."""
    event = _event("list-sa", {"x": {"state": "ESTABLISHED"}})
    try:
        for _ in range(5):
            for byte in event:
                conn.sendall(bytes([byte]))
                time.sleep(0.5)
    except OSError:
        pass


def test_an_interrupt_cuts_a_request_under_way_and_refuses_the_next(tmp_path):
    spec = CharonSpec(libipsec=False, socket_path=tmp_path / "charon.vici", state_dir=tmp_path)
    server, thread = _serve_once(spec.socket_path, _stream(_slow_drip))
    node = Charon(spec)
    outcome: list[str] = []

    def ask() -> None:
        try:
            with node.session() as vici:
                charon.sa_states(vici)
        except CharonError as error:
            outcome.append(str(error))

    asking = threading.Thread(target=ask)
    try:
        asking.start()
        time.sleep(1.0)  # the answer dripping
        started = time.monotonic()
        node.interrupt()
        asking.join(10)
        assert not asking.is_alive() and time.monotonic() - started < 2
        assert outcome == ["a request to charon cut short: flanneld is stopping"]
        with pytest.raises(CharonError, match="no request to charon: flanneld is stopping"), \
                node.session():
            pass
    finally:
        thread.join(10)
        server.close()
    assert not thread.is_alive()


@pytest.mark.parametrize(("event", "message"), [
    ({"flannel-a": {"state": ["ESTABLISHED"]}},
     "charon sent the state of IKE SA flannel-a as a list, not a value"),
    ({"flannel-a": {"state": "ESTABLISHED", "child-sas": "none"}},
     "charon sent a list-sa child event that is not a section"),
])
def test_sas_of_another_shape_are_refused_by_name(tmp_path, event, message):
    spec = CharonSpec(libipsec=False, socket_path=tmp_path / "charon.vici", state_dir=tmp_path)
    wire = _event("list-sa", event)
    server, thread = _serve_once(spec.socket_path, _stream(lambda conn: conn.sendall(wire)))
    try:
        with pytest.raises(CharonError) as raised, Charon(spec).session() as vici:
            charon.sa_states(vici)
        assert str(raised.value) == message
    finally:
        thread.join(5)
        server.close()


def test_sas_are_kept_only_as_far_as_the_backend_reads_them(tmp_path):
    spec = CharonSpec(libipsec=False, socket_path=tmp_path / "charon.vici", state_dir=tmp_path)
    sa = {"flannel-a": {"state": "ESTABLISHED", "remote-host": "10.0.0.2",
                        "child-sas": {"c-1": {"state": "INSTALLED", "bytes-in": "5"}}}}
    wire = _event("list-sa", sa)
    server, thread = _serve_once(spec.socket_path, _stream(lambda conn: conn.sendall(wire)))
    try:
        with Charon(spec).session() as vici:
            assert charon.sa_states(vici) == [{"flannel-a": {
                "state": b"ESTABLISHED", "child-sas": {"c-1": {"state": b"INSTALLED"}}}}]
    finally:
        thread.join(5)
        server.close()
