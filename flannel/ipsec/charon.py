"""strongSwan's charon for the ipsec backend: found, started, adopted, restarted, talked to.

Owns: finding the charon binary where Go flannel looks (``charon`` in PATH, then the
distributions' paths); flanneld's strongSwan config ``<state>/strongswan.conf`` (includes
``/etc/strongswan.conf``, then adds a log file with connection names for the PSK-mismatch
report and, where the kernel has no ESP, loads kernel-libipsec); the charon process flanneld
starts (its own session, so it outlives a flanneld restart and the next flanneld adopts it with
its established SAs), the marker ``<state>/charon.pid`` that makes it ours, restarts with
backoff when it dies, and stopping it (``stop``: for ``flannelctl cleanup``); one VICI
session per request on ``/var/run/charon.vici``, every answer bounded (``_BoundedTransport``:
bytes and time per message, events and time per stream), and the SAs and connections read
from it reduced, one event at a time, to what the backend uses, each field checked
(``sa_states``, ``connection_names``).
A charon that answers on the socket and that flanneld did not start is used, never stopped.
Synchronous: call from a worker thread.
Must not touch: other processes; strongSwan's own files (``/etc``); charon's SAs (the backend
decides what to load).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from flannel.files.fileutil import log_tail, open_log, read_head, write_atomic
from flannel.process import procstop
from flannel.timing.backoff import Backoff

log = logging.getLogger(__name__)

#: Where Go flannel looks for charon, in its order.
SEARCH = ("charon", "/usr/lib/strongswan/charon", "/usr/lib/ipsec/charon",
          "/usr/libexec/strongswan/charon", "/usr/libexec/ipsec/charon")
VICI_SOCKET = Path("/var/run/charon.vici")
STATE_DIR = Path("/run/flannel/ipsec")
#: How long a starting charon may take to answer on its VICI socket. A charon that fails exits,
#: which is seen at once; the bound only waits out a slow machine (under an emulated CPU on a
#: loaded host charon took over a minute to load its plugins).
STARTUP_TIMEOUT = 120.0
#: Seconds one VICI message may take to arrive, whole (a drip is cut, not waited for).
REQUEST_TIMEOUT = 10.0
#: Bytes of one VICI message: charon sends one event per IKE SA or connection, a few KiB.
MAX_MESSAGE = 64 * 1024
#: Events one streamed request may bring (list-sas, list-conns: one per SA or connection;
#: 20,000 peers and a quarter more), and seconds the whole stream may take.
MAX_EVENTS = 25_000
STREAM_TIMEOUT = 120.0
RESTART_FIRST, RESTART_LONGEST = 1.0, 30.0
_LOG_TAIL = 300
_MAX_PID_FILE = 64  # a pid and a newline; anything longer is not our marker
INSTALL_HINT = ("install strongSwan's charon with its VICI plugin (Debian: strongswan-charon "
                "libstrongswan-standard-plugins, and libcharon-extra-plugins where the kernel "
                "has no ESP)")


class CharonError(Exception):
    """charon cannot be started or does not answer; the message says what to fix."""


class _OverBudget(OSError):
    """A VICI answer beyond its bounds (the session's socket is shut down)."""


class _BoundedTransport:
    """The ``vici`` package's transport with bounds on what charon (or whatever answers on
    its socket) sends: each message within MAX_MESSAGE bytes and REQUEST_TIMEOUT seconds,
    whole; at most MAX_EVENTS events and STREAM_TIMEOUT seconds between two requests. Over
    a bound, the socket is shut down (what is left of the session fails at once) and
    _OverBudget raised. The package's own reads take any length (up to 4 GiB) and wait
    without a time limit once a message has begun."""

    HEADER = struct.Struct("!I")
    EVENT = 7  # the packet type of an event

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self._events = 0
        self._stream_end = 0.0
        self._failed: OSError | None = None  # once over a bound, every later use fails so

    def send(self, packet: bytes) -> None:
        if self._failed is not None:
            raise self._failed
        self._events = 0
        self._stream_end = time.monotonic() + STREAM_TIMEOUT
        self.socket.settimeout(REQUEST_TIMEOUT)
        self.socket.sendall(self.HEADER.pack(len(packet)) + packet)

    def receive(self, timeout: object = None) -> bytes:
        if self._failed is not None:
            raise self._failed
        deadline = min(time.monotonic() + REQUEST_TIMEOUT, self._stream_end)
        (length,) = self.HEADER.unpack(self._read(self.HEADER.size, deadline))
        if length > MAX_MESSAGE:
            self._refuse(f"a message of {length} bytes, over the limit of {MAX_MESSAGE}")
        payload = self._read(length, deadline)
        if payload[:1] == bytes([self.EVENT]):
            self._events += 1
            if self._events > MAX_EVENTS:
                self._refuse(f"more than {MAX_EVENTS} events for one request")
        return payload

    def _read(self, count: int, deadline: float) -> bytes:
        data = bytearray()
        while len(data) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                if deadline >= self._stream_end:
                    self._refuse(f"a stream of events longer than {STREAM_TIMEOUT:g}s")
                self._fail(TimeoutError())  # a message not whole in time: a drip is cut
            self.socket.settimeout(left)
            try:
                chunk = self.socket.recv(min(count - len(data), 65536))
            except TimeoutError:
                continue  # the deadline is checked above
            if not chunk:
                raise ConnectionResetError("Connection closed")
            data += chunk
        return bytes(data)

    def _refuse(self, why: str) -> NoReturn:
        self._fail(_OverBudget(why))

    def _fail(self, error: OSError) -> NoReturn:
        self._failed = error
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        raise error

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()


def find_charon() -> str:
    for candidate in SEARCH:
        found = shutil.which(candidate)
        if found is not None:
            return found
    raise CharonError(f"no charon executable found at {', '.join(SEARCH)}; {INSTALL_HINT}")


def config_text(log_path: Path, libipsec: bool) -> str:
    """flanneld's strongswan.conf: the system's, plus a log whose lines name the connection
    (the PSK-mismatch report reads it) and the ESP data path."""
    load = "yes" if libipsec else "no"
    return (
        "# Written by flanneld (ipsec backend); rewritten at every start of charon.\n"
        "include /etc/strongswan.conf\n"
        "charon {\n"
        "  filelog {\n"
        "    flannel {\n"
        f"      path = {log_path}\n"
        "      time_format = %Y-%m-%dT%H:%M:%S\n"
        "      ike_name = yes\n"
        "      append = yes\n"
        "      flush_line = yes\n"
        "      default = 1\n"
        "    }\n"
        "  }\n"
        "  plugins {\n"
        "    kernel-libipsec {\n"
        f"      load = {load}\n"
        "    }\n"
        "  }\n"
        "}\n")


def process_conf(pid: int) -> str | None:
    """The STRONGSWAN_CONF a running charon was started with (None: not a charon, gone, or
    none)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "charon":
                return None
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read(1 << 20)
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"STRONGSWAN_CONF="):
            return entry.split(b"=", 1)[1].decode("utf-8", "replace")
    return None


def our_pid(state_dir: Path) -> int | None:
    """The charon flanneld started from ``state_dir``, when it still runs: the pid in the
    marker, checked against the process's own config path (a reused pid is not ours)."""
    spec = CharonSpec(libipsec=False, state_dir=state_dir)
    try:
        data, more = read_head(spec.pid_path, _MAX_PID_FILE)
    except OSError:
        return None
    text = data.decode("ascii", "replace").strip()
    if more or not text.isdigit():
        return None
    pid = int(text)
    return pid if process_conf(pid) == str(spec.conf_path) else None


def stop(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM the charon ``pid`` (then SIGKILL after ``timeout``); True when it is gone.
    charon removes its TUN device, routes and policies as it exits."""
    return procstop.stop(pid, timeout, running=lambda p: process_conf(p) is not None)


def _cause(err: Exception) -> str:
    """What went wrong, for a user (a timeout says nothing by itself; charon's own error
    text is bounded)."""
    if isinstance(err, TimeoutError):
        return f"no reply within {REQUEST_TIMEOUT:g}s"
    if isinstance(err, _OverBudget):
        return f"{err}; refusing the answer"
    text = str(err) or type(err).__name__
    return text[:300]


@dataclass
class CharonSpec:
    """``wrap``: turns charon's argv into the command that runs it where flanneld programs
    (a named network namespace); ``libipsec``: load kernel-libipsec (no ESP in the kernel)."""

    libipsec: bool
    socket_path: Path = VICI_SOCKET
    state_dir: Path = STATE_DIR
    wrap: Callable[[list[str]], list[str]] = field(default=list)

    @property
    def conf_path(self) -> Path:
        return self.state_dir / "strongswan.conf"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "charon.log"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "charon.pid"


class Charon:
    """The charon of this node. ``generation`` grows every time a new charon answers: what
    was loaded into the previous one is gone and must be loaded again."""

    def __init__(self, spec: CharonSpec) -> None:
        self.spec = spec
        self.generation = 0
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._next_start = 0.0
        self._backoff = Backoff(RESTART_FIRST, RESTART_LONGEST)
        # The sessions' sockets, shut down by interrupt() when flanneld stops.
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self._stopping = False

    def interrupt(self) -> None:
        """flanneld is stopping: a request under way fails at once (its socket is shut
        down: a charon that answers a byte at a time would hold a pass, and the exit, up to
        a stream's STREAM_TIMEOUT), and every later session is refused. Any thread; never
        blocks."""
        with self._open_lock:
            self._stopping = True
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    # -- VICI -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        """A VICI session (the ``vici`` package's ``Session``), closed afterwards. Whatever
        fails while it is used (charon refuses a request, the socket breaks or times out, a
        reply cannot be decoded) comes out as CharonError."""
        try:
            import vici
            import vici.exception
        except ImportError:
            raise CharonError("the ipsec backend needs the vici package: install pyflannel "
                              "with its ipsec extra (pip install 'pyflannel[ipsec]')") from None
        # struct.error and UnicodeDecodeError: vici's decoder on a truncated or garbled reply.
        failures = (OSError, struct.error, UnicodeDecodeError,
                    vici.exception.DeserializationException,
                    vici.exception.SessionException, vici.exception.CommandException,
                    vici.exception.EventUnknownException)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(REQUEST_TIMEOUT)
        with self._open_lock:
            if self._stopping:
                sock.close()
                raise CharonError("no request to charon: flanneld is stopping")
            self._open.add(sock)
        try:
            try:
                sock.connect(str(self.spec.socket_path))
            except OSError as err:
                raise CharonError(f"charon does not answer on {self.spec.socket_path}: "
                                  f"{os.strerror(err.errno or errno.EIO)}") from None
            session = vici.Session(sock)
            session.transport = _BoundedTransport(sock)
            try:
                yield session
            except failures as err:
                if self._stopping:
                    raise CharonError("a request to charon cut short: flanneld is "
                                      "stopping") from None
                raise CharonError(f"charon on {self.spec.socket_path} failed a request: "
                                  f"{_cause(err)}") from None
        finally:
            with self._open_lock:
                self._open.discard(sock)
            sock.close()

    def answers(self) -> bool:
        try:
            with self.session() as vici:
                vici.version()
        except CharonError as err:
            log.debug("%s", err)
            return False
        return True

    # -- the process ------------------------------------------------------------------------

    def _log_tail(self) -> str:
        return log_tail(self.spec.log_path, _LOG_TAIL)

    def _reap(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            log.error("charon (pid %d) exited with status %s; last lines of %s: %s",
                      self._process.pid, self._process.returncode, self.spec.log_path,
                      self._log_tail())
            self._process = None
            self.pid = None

    def ensure(self) -> int:
        """Make sure a charon answers (adopt one, or start ours); the generation."""
        self._reap()
        if self.answers():
            if self.generation == 0:
                self._adopt()
            elif time.monotonic() > self._next_start:  # it outlived its restart delay
                self._backoff.reset()
            return self.generation
        now = time.monotonic()
        if now < self._next_start:
            raise CharonError(f"charon does not answer on {self.spec.socket_path}; starting "
                              f"it again in {self._next_start - now:.0f}s")
        self._next_start = now + self._backoff.grow()
        self._start()
        self.generation += 1
        return self.generation

    def _adopt(self) -> None:
        self.generation = 1
        self.pid = our_pid(self.spec.state_dir)
        if self.pid is not None:
            log.info("adopting the running charon (pid %d) started by a previous flanneld; its "
                     "SAs are kept", self.pid)
        else:
            log.warning("a charon that flanneld did not start answers on %s: using it (its "
                        "strongSwan config is its own, and flanneld will never stop it)",
                        self.spec.socket_path)

    def _start(self) -> None:
        binary = find_charon()
        self.spec.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.spec.conf_path,
                     config_text(self.spec.log_path, self.spec.libipsec).encode(), 0o600)
        out = open_log(self.spec.log_path)
        env = {**os.environ, "STRONGSWAN_CONF": str(self.spec.conf_path)}
        try:
            # Its own session and no pipes: it keeps its SAs across a flanneld restart.
            self._process = subprocess.Popen(
                self.spec.wrap([binary]), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env=env, start_new_session=True, close_fds=True)
        finally:
            os.close(out)
        self.pid = self._process.pid
        write_atomic(self.spec.pid_path, f"{self.pid}\n".encode(), 0o644)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.answers():
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise CharonError(f"charon exited with status {code} at start: "
                                  f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise CharonError(f"charon did not answer on {self.spec.socket_path} within "
                                  f"{STARTUP_TIMEOUT:g}s: {self._log_tail()}")
            time.sleep(0.05)
        log.info("charon started (pid %d, %s ESP, log %s)", self.pid,
                 "userspace (kernel-libipsec)" if self.spec.libipsec else "kernel",
                 self.spec.log_path)

    def read_log(self, offset: int, limit: int = 1 << 20) -> tuple[int, Sequence[str]]:
        """Lines charon logged from ``offset`` on (at most ``limit`` bytes); the next offset.
        A log that shrank (rotated, rewritten) is read from its start."""
        try:
            with open(self.spec.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < offset:
                    offset = 0
                offset = max(offset, size - limit)
                f.seek(offset)
                data = f.read(limit)
        except OSError:
            return offset, ()
        end = data.rfind(b"\n") + 1
        return offset + end, data[:end].decode("utf-8", "replace").splitlines()


def _named(event: object, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """An event's ``{name: section}`` items, each name a string and each section a dict."""
    if not isinstance(event, dict):
        raise CharonError(f"charon sent a {what} event that is not a section")
    for name, section in event.items():
        if not isinstance(name, str) or len(name) > 256 or not isinstance(section, dict):
            raise CharonError(f"charon sent a {what} event of another shape (a "
                              f"{type(section).__name__} under {str(name)[:60]!r})")
        yield name, section


def _state(section: dict[str, Any], what: str) -> bytes:
    state = section.get("state", b"")
    if not isinstance(state, bytes) or len(state) > 64:
        raise CharonError(f"charon sent the state of {what} as a {type(state).__name__}, "
                          "not a value")
    return state


def sa_states(session: Any) -> list[dict[str, Any]]:
    """``list-sas``, each IKE SA reduced to ``{name: {"state": ..., "child-sas": {child:
    {"state": ...}}}}`` (the shape ``ipsec.config.established`` reads), one event at a
    time: a stream of thousands of SAs holds only what is kept."""
    sas = []
    for event in session.list_sas():
        for name, ike in _named(event, "list-sa"):
            children = ike.get("child-sas") or {}
            kept = {child: {"state": _state(section, f"child SA {child[:60]}")}
                    for child, section in _named(children, "list-sa child")}
            sas.append({name: {"state": _state(ike, f"IKE SA {name[:60]}"),
                               "child-sas": kept}})
    return sas


def connection_names(session: Any, prefix: str) -> set[str]:
    """The names of the connections charon holds that start with ``prefix`` (``list-conns``,
    one event at a time)."""
    return {name for event in session.list_conns()
            for name, _ in _named(event, "list-conn") if name.startswith(prefix)}
