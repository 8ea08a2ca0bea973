"""Network namespaces for tests: unique names per test run, always removed.

Every namespace is named ``<run prefix><n>`` so that parallel runs and the lab never clash
and a sweep at the end of the session can find leftovers of this run only.
"""

from __future__ import annotations

import os
import subprocess

from flannel.lab.cluster import kill_netns_processes

RUN_PREFIX = f"pft{os.getpid() % 100000}x"
_counter = 0


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
    ip("link", "set", "lo", "up", netns=name)
    return name


def delete(name: str) -> None:
    """Stop what still runs inside, then remove the namespace (bounded)."""
    kill_netns_processes(name)
    ip("netns", "del", name, check=False)


def sweep() -> None:
    """Remove every namespace of this run that a test failed to remove."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(RUN_PREFIX):
            delete(name)
