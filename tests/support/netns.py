"""Network namespaces for tests: names no one else can share, always removed.

Every namespace is named ``<run prefix><n>``; the prefix holds a random token, so parallel
runs, the lab and anyone else never clash. The session-end sweep removes only namespaces
this run recorded creating and still exist, never anything matched by a name pattern.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time

RUN_PREFIX = f"pft{secrets.token_hex(4)}x"
_counter = 0
_created: list[str] = []


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip()}")
    return result


def create(tag: str = "") -> str:
    global _counter
    _counter += 1
    name = f"{RUN_PREFIX}{_counter}{tag}"
    ip("netns", "add", name)
    _created.append(name)
    ip("link", "set", "lo", "up", netns=name)
    return name


def kill_processes(name: str, timeout: float = 5.0) -> None:
    """Stop what runs inside our namespace ``name``: SIGTERM, then SIGKILL after ``timeout``."""
    def pids() -> list[int]:
        return [int(pid) for pid in ip("netns", "pids", name, check=False).stdout.split()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + timeout
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)


def delete(name: str) -> None:
    """Stop what still runs inside, then remove the namespace (bounded)."""
    kill_processes(name)
    ip("netns", "del", name, check=False)
    if name in _created:
        _created.remove(name)


def sweep() -> None:
    """Remove the namespaces this run created and a test failed to remove."""
    listed = {line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines()
              if line.strip()}
    for name in list(_created):
        if name in listed:
            delete(name)
        else:
            _created.remove(name)


def netns_names() -> set[str]:
    """The names of the network namespaces that exist now (anyone's)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}
