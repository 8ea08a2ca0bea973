"""``flannelctl cleanup``: remove from this node everything flanneld and install-cni created.

Owns the inventory of what is ours and how each object is recognised, so that nothing else
is ever removed:
- devices by name *and* type: ``flannel.<VNI>``/``flannel-v6.<VNI>`` vxlan, ``flannel.ipip``
  ipip, ``flannel-wg``/``flannel-wg-v6`` wireguard, ``flannel<N>`` tun;
- routes carrying our protocol (151) in the main table, blackholes included;
- permanent neighbour and FDB entries on our vxlan devices;
- the ``FLANNEL-POSTRTG``/``FLANNEL-FWD`` chains and the rules jumping to them, in every
  installed iptables backend (legacy, nft) and family; the nft tables ``flannel-ipv4`` and
  ``flannel-ipv6``;
- subnet.env when it holds only ``FLANNEL_*`` settings; in the CNI directories, the
  ``flannel`` launcher install-cni writes, its ``.flannel-cni*`` module directories, and
  ``10-flannel.conflist`` when it configures the flannel plugin.
Refuses while a flanneld runs in the same network namespace (it would recreate everything).
Must not touch: anything that fails those checks; files are never followed through symlinks.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flannel import boundedjson
from flannel.cni.install import CONFLIST_NAME, LAUNCHER_MARK
from flannel.kernel import links, rtnl
from flannel.rules import iptables, nftables
from flannel.rules.mode import installed

# (name pattern, link kind) of every device a flannel backend creates.
OWN_DEVICES = (
    (re.compile(r"flannel(-v6)?\.\d+"), "vxlan"),
    (re.compile(r"flannel\.ipip"), "ipip"),
    (re.compile(r"flannel-wg(-v6)?"), "wireguard"),
    (re.compile(r"flannel\d+"), "tun"),
)
MAX_SCAN_BYTES = 64 * 1024  # files larger than this are not ours


class CleanupError(Exception):
    """Cleanup cannot proceed; the message says why and what to do."""


@dataclass
class Item:
    """One object to remove: what it is (as the user reads it) and how."""

    what: str
    remove: Callable[[], None]


@dataclass
class Inventory:
    items: list[Item] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # look like ours but are not: left alone
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in self.closers:
            close()


# -- refusing while flanneld runs ------------------------------------------------------------

def is_flanneld(cmdline: bytes) -> bool:
    argv = [arg for arg in cmdline.split(b"\0") if arg][:2]
    # Go flanneld is argv[0]; the Python console script runs as "python .../flanneld".
    return any(os.path.basename(arg) == b"flanneld" for arg in argv)


def running_flanneld(proc: Path = Path("/proc")) -> list[int]:
    """Process ids of flanneld processes in this process's network namespace."""
    own = os.stat(proc / "self" / "ns" / "net")
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with (entry / "cmdline").open("rb") as handle:
                cmdline = handle.read(4096)
            if not is_flanneld(cmdline):
                continue
            netns = os.stat(entry / "ns" / "net")
        except OSError:
            continue  # gone meanwhile, or not ours to inspect
        if (netns.st_dev, netns.st_ino) == (own.st_dev, own.st_ino):
            found.append(int(entry.name))
    return sorted(found)


# -- kernel objects --------------------------------------------------------------------------

def _own_kind(name: str) -> str | None:
    for pattern, kind in OWN_DEVICES:
        if pattern.fullmatch(name):
            return kind
    return None


def _route_text(route: rtnl.Route, names: dict[int, str]) -> str:
    if route.kind == rtnl.RTN_BLACKHOLE:
        return f"blackhole route {route.dst} metric {route.metric} proto 151"
    text = f"route {route.dst}"
    if route.gateway:
        text += f" via {route.gateway}"
    if route.oif:
        text += f" dev {names.get(route.oif, route.oif)}"
    return text + (" onlink" if route.onlink else "") + " proto 151"


def kernel_items(inventory: Inventory) -> None:
    sock = rtnl.Rtnl()
    inventory.closers.append(sock.close)
    names: dict[int, str] = {}
    devices: list[tuple[int, str, str]] = []
    for details in links.dump_links(sock):
        index, name, kind = details.link.index, details.link.name or "", details.kind
        names[index] = name
        want = _own_kind(name)
        if want is None:
            continue
        if kind == want:
            devices.append((index, name, kind))
        else:
            inventory.kept.append(f"device {name}: a {kind or 'plain'} device, not the {want} "
                                  "device flannel creates")

    def delete(obj: object) -> Callable[[], None]:
        def run() -> None:
            failures = sock.run([("delete", obj)])
            if failures:
                raise failures[0]
        return run

    family: int
    for family in (socket.AF_INET, socket.AF_INET6):
        for route, proto, table in sock.routes(family):
            if proto == rtnl.RTPROT_FLANNEL and table == rtnl.RT_TABLE_MAIN:
                inventory.items.append(Item(_route_text(route, names), delete(route)))
    vxlan = {index: name for index, name, kind in devices if kind == "vxlan"}
    for family in (socket.AF_INET, socket.AF_INET6, rtnl.AF_BRIDGE):
        for entry, state, _flags in sock.neighbours(family):
            if entry.ifindex not in vxlan or not state & rtnl.NUD_PERMANENT:
                continue
            dev = vxlan[entry.ifindex]
            if isinstance(entry, rtnl.FdbEntry):
                what = f"fdb entry {entry.mac} dst {entry.dst} dev {dev}"
            else:
                what = f"neighbour {entry.ip} lladdr {entry.mac} dev {dev}"
            inventory.items.append(Item(what, delete(entry)))
    def delete_link(index: int) -> Callable[[], None]:
        def run() -> None:
            links.delete_link(sock, index, "delete the device")
        return run

    for index, name, kind in devices:
        inventory.items.append(Item(f"device {name} ({kind})", delete_link(index)))


def rule_items(inventory: Inventory) -> None:
    variants = [v for v in (iptables.LEGACY, iptables.NFT) if installed(v)]
    if not variants:
        variants = [iptables.PLAIN]  # iptables before 1.8: one backend, unsuffixed names
    for variant in variants:
        for version in (4, 6):
            listing = iptables.save_listing(variant, version)
            for found in iptables.find_own_chains(listing, variant, version):
                inventory.items.append(Item(found.describe(),
                                            functools.partial(iptables.remove_chain, found)))
    for family, table in nftables.find_tables():
        inventory.items.append(Item(
            f"nft table {family} {table}",
            functools.partial(nftables.remove_table, family, table)))


# -- files -----------------------------------------------------------------------------------

def _small_text(path: Path) -> str | None:
    """The text of a regular file (never a symlink) of bounded size, else None."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SCAN_BYTES:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _remove_file(path: Path) -> Callable[[], None]:
    return lambda: path.unlink()


def is_subnet_env(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    return bool(lines) and all(re.fullmatch(r"FLANNEL_[A-Z0-9_]+=[^\n]*", line)
                               for line in lines) and any(
        line.startswith(("FLANNEL_SUBNET=", "FLANNEL_IPV6_SUBNET=")) for line in lines)


def is_our_launcher(text: str) -> bool:
    return text.startswith("#!") and LAUNCHER_MARK in text


def is_flannel_conflist(text: str) -> bool:
    try:
        document = boundedjson.loads(text, what="conflist", max_bytes=boundedjson.MAX_CONFIG_BYTES)
    except boundedjson.JSONLimitError:
        return False
    plugins = document.get("plugins") if isinstance(document, dict) else None
    return isinstance(plugins, list) and any(
        isinstance(p, dict) and p.get("type") == "flannel" for p in plugins)


def _holds_plugin(directory: Path) -> bool:
    """A module directory install-cni wrote: it holds ``flannel/cni/plugin.py`` (looked
    for at most three levels down, so versioned layouts are recognised too)."""
    pending = [(directory, 0)]
    while pending:
        here, depth = pending.pop()
        if (here / "flannel" / "cni" / "plugin.py").is_file():
            return True
        if depth < 3:
            try:
                pending += [(child, depth + 1) for child in here.iterdir()
                            if child.is_dir() and not child.is_symlink()]
            except OSError:
                continue
    return False


def file_items(inventory: Inventory, subnet_file: Path, bin_dirs: list[Path],
               conf_dirs: list[Path]) -> None:
    def consider(path: Path, ours: Callable[[str], bool], why_not: str) -> None:
        if not path.exists() and not path.is_symlink():
            return
        text = _small_text(path)
        if text is not None and ours(text):
            inventory.items.append(Item(f"file {path}", _remove_file(path)))
        else:
            inventory.kept.append(f"file {path}: {why_not}")

    consider(subnet_file, is_subnet_env, "not a subnet.env written by flanneld")
    for bin_dir in bin_dirs:
        consider(bin_dir / "flannel", is_our_launcher,
                 "not the launcher install-cni writes (an upstream flannel CNI binary?)")
        for entry in _entries(bin_dir):
            if not entry.name.startswith(".flannel-cni"):
                continue
            if entry.is_symlink():
                inventory.items.append(Item(f"symlink {entry}", _remove_file(entry)))
            elif entry.is_dir() and _holds_plugin(entry):
                inventory.items.append(Item(f"directory {entry}",
                                            functools.partial(shutil.rmtree, entry)))
            else:
                inventory.kept.append(f"{entry}: does not hold the flannel CNI modules")
    for conf_dir in conf_dirs:
        consider(conf_dir / CONFLIST_NAME, is_flannel_conflist,
                 "does not configure the flannel plugin")


def _entries(directory: Path) -> Iterator[Path]:
    try:
        yield from sorted(directory.iterdir())
    except OSError:
        return


# -- the command -----------------------------------------------------------------------------

def inventory(subnet_file: Path, bin_dirs: list[Path], conf_dirs: list[Path]) -> Inventory:
    found = Inventory()
    kernel_items(found)
    rule_items(found)
    file_items(found, subnet_file, bin_dirs, conf_dirs)
    return found


def check_not_running(force: bool, proc: Path = Path("/proc")) -> str | None:
    """A refusal message while flanneld runs here (None with ``force`` or when none runs)."""
    pids = running_flanneld(proc)
    if not pids or force:
        return None
    listed = ", ".join(map(str, pids))
    return (f"flanneld is running in this network namespace (pid {listed}); it would "
            "recreate what cleanup removes. Stop it first (kubectl delete the DaemonSet, or "
            "systemctl stop flanneld), or pass --force")


def remove(found: Inventory) -> list[tuple[Item, str]]:
    """Remove every item in order; the failures, with their reason."""
    failures = []
    for item in found.items:
        try:
            item.remove()
        except (OSError, iptables.RulesError) as err:
            failures.append((item, str(err)))
    return failures
