"""A flood of idle TCP connections to a health port, run as its own process inside a netns.

``HealthFlood`` starts ``FLOOD`` (below) in the namespace: it keeps ``count`` connections to
127.0.0.1:<port> open and sends nothing on them (or only ``first_bytes``, the start of a
request that never ends); one the server closes is opened again, at
most ``reopen_per_second`` a second (500 by default: an attacker who keeps the flood up, at
a rate that cannot become a CPU test on a 2-core machine), or at once (``None``: one who
makes it one). Commands on its stdin, one JSON answer a line:
``wait N SECONDS`` (until N connects completed, or the time is up), ``probe N PATH
[INTERVAL]`` (N GETs on fresh connections INTERVAL seconds apart while the flood goes on,
each timed from connect to the whole answer), ``stats``. It closes
every socket and exits on end of input, and by itself after ``lifetime`` seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

FLOOD = r"""
import json, resource, selectors, socket, sys, time

port, count, lifetime = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
REOPEN_PER_SECOND = float(sys.argv[4])  # inf: at once
FIRST_BYTES = bytes.fromhex(sys.argv[5])  # sent on each connection once it is open
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
end = time.monotonic() + lifetime
sel = selectors.DefaultSelector()
stats = {"connects": 0, "open": 0, "closed_by_server": 0, "connect_errors": 0}
socks = set()
owed = 0


def open_one():
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    socks.add(s)
    sel.register(s, selectors.EVENT_WRITE, False)


def drop(s):
    sel.unregister(s)
    socks.discard(s)
    s.close()


def probe(n, path):
    out = []
    for _ in range(n):
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: flood\r\n\r\n".encode())
                data = b""
                while chunk := c.recv(65536):
                    data += chunk
            status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
        except OSError as err:
            status, data = 0, str(err).encode()
        out.append({"status": status, "ms": round((time.monotonic() - started) * 1000, 2),
                    "body": data.partition(b"\r\n\r\n")[2].decode(errors="replace")[:200]})
    return out


def on_socket(s, events):
    global owed
    if events & selectors.EVENT_WRITE:
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            stats["connect_errors"] += 1
            drop(s)
            owed += 1
        else:
            stats["connects"] += 1
            if FIRST_BYTES:
                s.send(FIRST_BYTES)
            sel.modify(s, selectors.EVENT_READ, False)
    elif events & selectors.EVENT_READ:
        try:
            gone = s.recv(4096) == b""
        except OSError:
            gone = True
        if gone:
            stats["closed_by_server"] += 1
            drop(s)
            owed += 1


def reply(answer):
    answer.update(stats, open=len(socks))
    print(json.dumps(answer), flush=True)


for _ in range(count):
    open_one()
sel.register(sys.stdin, selectors.EVENT_READ, True)
last = time.monotonic()
job = None  # the command being carried out: [kind, args..., deadline or next probe time]
try:
    while time.monotonic() < end:
        now = time.monotonic()
        budget = owed if REOPEN_PER_SECOND == float("inf") else \
            int((now - last) * REOPEN_PER_SECOND)
        if budget:
            last = now
        while owed and budget:
            open_one()
            owed -= 1
            budget -= 1
        if job and job[0] == "wait" and (stats["connects"] >= job[1] or now >= job[2]):
            reply({})
            job = None
        elif job and job[0] == "probe" and now >= job[4]:
            job[5].extend(probe(1, job[2]))
            job[4] = time.monotonic() + job[3]
            if len(job[5]) >= job[1]:
                reply({"probes": job[5]})
                job = None
        for key, events in sel.select(0 if owed and REOPEN_PER_SECOND == float("inf")
                                      else 0.01):
            if key.data is not True:
                if key.fileobj in socks:
                    on_socket(key.fileobj, events)
                continue
            line = sys.stdin.readline()
            if not line:
                raise SystemExit
            cmd = line.split()
            if cmd[0] == "wait":
                job = ["wait", int(cmd[1]), time.monotonic() + float(cmd[2])]
            elif cmd[0] == "probe":
                job = ["probe", int(cmd[1]), cmd[2], float(cmd[3]) if len(cmd) > 3 else 0.0,
                       0.0, []]
            else:
                reply({})
finally:
    for s in list(socks):
        s.close()
"""


class HealthFlood:
    """``count`` idle connections to ``port`` on 127.0.0.1 inside ``netns``."""

    def __init__(self, netns: str, port: int, count: int, lifetime: float = 120.0,
                 reopen_per_second: float | None = 500, first_bytes: bytes = b"") -> None:
        rate = "inf" if reopen_per_second is None else str(reopen_per_second)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", FLOOD, str(port), str(count),
             str(lifetime), rate, first_bytes.hex()], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the flood process ended (exit {self.proc.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """Every connection closed, the process gone."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> HealthFlood:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
