"""Continuous UDP streams with sequence numbers between pods, to count every lost datagram.

``UdpMesh`` runs one endpoint per pod namespace (``python -m tests.support.udpstream`` inside
it). Each endpoint sends a datagram to every other endpoint each ``interval`` seconds, with a
sequence number of its own per destination, and records what arrives from each source: the
distinct sequence numbers, duplicates, and the longest silence between two arrivals. ``stop``
ends the sending everywhere first, lets what is in flight arrive, then collects a ``Flow`` per
ordered pair: sent (by the source's count), received (by the destination's), lost.

A datagram the kernel refuses to send (no route: ``sendto`` fails) still takes its sequence
number, so it counts as lost. Endpoints take commands on their stdin (``go``, ``seen``,
``stop``, ``report``) and answer each on one stdout line; each exits after its report or when
its stdin closes, so none outlives the test.
Must not touch: anything but its own sockets in the namespaces it is given.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUIET = 0.3  # seconds without a datagram after every sender stopped: nothing is in flight
DRAIN_LIMIT = 3.0


@dataclass
class Flow:
    src: str
    dst: str
    sent: int
    received: int
    duplicates: int
    send_errors: int
    max_gap: float  # the longest silence between two arrivals, in seconds

    @property
    def lost(self) -> int:
        return self.sent - self.received


class UdpMesh:
    """Streams between every ordered pair of ``endpoints`` (name -> (netns, address))."""

    def __init__(self, endpoints: dict[str, tuple[str, str]], port: int = 9977,
                 interval: float = 0.01) -> None:
        self.endpoints = endpoints
        self.port = port
        self.interval = interval
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> UdpMesh:
        try:
            for name, (netns, address) in self.endpoints.items():
                peers = [a for n, (_, a) in self.endpoints.items() if n != name]
                self.procs[name] = subprocess.Popen(
                    ["ip", "netns", "exec", netns, sys.executable, "-m", "tests.support.udpstream",
                     address, str(self.port), str(self.interval), *peers],
                    cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for name in self.procs:
                assert self._line(name, 10) == "ready", f"{name}: endpoint did not start"
            for name in self.procs:
                self._send(name, "go")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout):
                if stream:
                    stream.close()

    def _send(self, name: str, command: str) -> None:
        stdin = self.procs[name].stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()

    def _line(self, name: str, timeout: float) -> str:
        stdout = self.procs[name].stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"endpoint {name}: no answer within {timeout:g}s")
        return stdout.readline().strip()

    def received_from_all(self) -> bool:
        """Whether every endpoint has heard from every other one (polled through ``seen``)."""
        for name in self.procs:
            self._send(name, "seen")
        heard = [json.loads(self._line(name, 5)) for name in self.procs]  # every answer read
        return all(count == len(self.procs) - 1 for count in heard)

    def stop(self) -> list[Flow]:
        """Stop sending everywhere, wait for what is in flight, and count every pair."""
        sent: dict[str, dict[str, list[int]]] = {}
        for name in self.procs:
            self._send(name, "stop")
        for name in self.procs:
            sent[name] = json.loads(self._line(name, 5))
        received: dict[str, dict[str, list[float]]] = {}
        for name in self.procs:
            self._send(name, "report")
        for name in self.procs:
            received[name] = json.loads(self._line(name, DRAIN_LIMIT + 5))
        by_address = {address: name for name, (_, address) in self.endpoints.items()}
        flows = []
        for src, per_dst in sent.items():
            for dst_address, (count, errors) in per_dst.items():
                dst = by_address[dst_address]
                got, dups, gap = received[dst].get(self.endpoints[src][1], (0, 0, 0.0))
                flows.append(Flow(src, dst, count, int(got), int(dups), errors, gap))
        return flows


def serve(address: str, port: int, interval: float, peers: list[str]) -> None:
    """The endpoint: send to ``peers`` every ``interval`` s, count what arrives."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    sock.setblocking(False)
    seq = dict.fromkeys(peers, 0)
    errors = dict.fromkeys(peers, 0)
    seen: dict[str, set[int]] = {}
    dups: dict[str, int] = {}
    last: dict[str, float] = {}
    gap: dict[str, float] = {}
    commands = sys.stdin.fileno()
    print("ready", flush=True)
    sending = False
    next_send = time.monotonic()
    quiet_since = 0.0
    drain_deadline = 0.0
    pending = b""

    def receive() -> bool:
        got = False
        while True:
            try:
                data, (source, _) = sock.recvfrom(64)
            except BlockingIOError:
                return got
            now = time.monotonic()
            got = True
            number = int(data)
            numbers = seen.setdefault(source, set())
            if number in numbers:
                dups[source] = dups.get(source, 0) + 1
            numbers.add(number)
            if source in last:
                gap[source] = max(gap.get(source, 0.0), now - last[source])
            last[source] = now

    while True:
        now = time.monotonic()
        if drain_deadline:
            wait = QUIET
        elif sending:
            wait = max(0.0, next_send - now)
        else:
            wait = 1.0
        readable, _, _ = select.select([sock, commands], [], [], wait)
        if sock in readable and receive():
            quiet_since = time.monotonic()
        if commands in readable:
            chunk = os.read(commands, 4096)
            if not chunk:  # stdin closed: the test is gone
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                command = line.decode().strip()
                if command == "go":
                    sending, next_send = True, time.monotonic()
                elif command == "seen":
                    print(len(seen), flush=True)
                elif command == "stop":
                    sending = False
                    print(json.dumps({p: (seq[p], errors[p]) for p in peers}), flush=True)
                elif command == "report":
                    quiet_since = time.monotonic()
                    drain_deadline = quiet_since + DRAIN_LIMIT
        now = time.monotonic()
        if drain_deadline and (now - quiet_since >= QUIET or now >= drain_deadline):
            receive()
            print(json.dumps({s: (len(n), dups.get(s, 0), round(gap.get(s, 0.0), 4))
                              for s, n in seen.items()}), flush=True)
            return
        if sending and now >= next_send:
            for peer in peers:
                try:
                    sock.sendto(str(seq[peer]).encode(), (peer, port))
                except OSError:
                    errors[peer] += 1
                seq[peer] += 1
            # A stall (the machine is busy) is not made up by a burst.
            next_send = max(next_send + interval, now)


def main() -> None:
    address, port, interval, *peers = sys.argv[1:]
    serve(address, int(port), float(interval), peers)


if __name__ == "__main__":
    main()
