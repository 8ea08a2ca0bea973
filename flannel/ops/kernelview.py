"""What the kernel of this network namespace holds, read with ``ip -j`` and ``bridge -j``.

Owns running those tools (argument lists, no shell, bounded in time and output) and reading
sysctls. Read-only: must not change anything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOL_TIMEOUT = 10.0
MAX_OUTPUT = 64 << 20


class ToolError(Exception):
    """A tool could not be run or gave no usable answer; the message names it."""


def run_tool(*cmd: str, timeout: float = TOOL_TIMEOUT) -> str:
    path = shutil.which(cmd[0]) or cmd[0]
    try:
        proc = subprocess.run([path, *cmd[1:]], capture_output=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ToolError(f"{cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(cmd)}: no answer after {timeout:g}s") from None
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(cmd)}: "
                        f"{proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout[:MAX_OUTPUT].decode(errors="replace")


def ip_json(*args: str, tool: str = "ip") -> list[dict[str, Any]]:
    text = run_tool(tool, "-j", *args).strip()
    if not text:
        return []
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ToolError(f"{tool} -j {' '.join(args)}: not JSON ({err})") from None
    return [entry for entry in doc if isinstance(entry, dict)] if isinstance(doc, list) else []


@dataclass
class KernelView:
    """The links of this namespace (``ip -j -d link``: their kind, flags, MTU, MAC and
    tunnel attributes, as the checks show them); the routes and neighbours are read
    over netlink where they are compared (``flannel/ops/plans.py``)."""

    links: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def link(self, name: str) -> dict[str, Any] | None:
        return next((link for link in self.links if link.get("ifname") == name), None)


def read_kernel() -> KernelView:
    view = KernelView()
    try:
        view.links = ip_json("-d", "link", "show")
    except ToolError as err:
        view.errors.append(str(err))
    return view


def read_sysctl(root: Path, key: str) -> str | None:
    """A sysctl's value by its path under /proc/sys (``net/ipv4/ip_forward``); None when it
    does not exist."""
    path = root / key
    try:
        with path.open("rb") as handle:
            return handle.read(4096).decode(errors="replace").strip()
    except OSError:
        return None
