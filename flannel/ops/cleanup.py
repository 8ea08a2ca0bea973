"""``flannelctl cleanup``: remove from this node everything flanneld and install-cni created.

Owns the inventory of what is ours and how each object is recognised, so that nothing else
is ever removed:
- devices by name *and* kind, as every registered backend declares them in its footprint
  (``Footprint.links``; a device a userspace program serves, ``Link.userspace``, is its
  backend's to remove with that program);
- what each registered backend says it leaves besides (``Backend.leftovers``: a program it
  started, its sockets and files, policies of its engine), looked up for every backend
  whatever ran here;
- routes carrying our protocol (151) in the main table, blackholes included, and the other
  routes through our devices (a network route through a device), kernel ones aside;
- permanent neighbour and FDB entries on the devices declared to hold them;
- the ``FLANNEL-POSTRTG``/``FLANNEL-FWD`` chains and the rules jumping to them, in every
  installed iptables backend (legacy, nft) and family; the nft tables ``flannel-ipv4`` and
  ``flannel-ipv6``;
- subnet.env when it holds only ``FLANNEL_*`` settings, and flanneld's socket beside it when
  nobody listens on it (left by a flanneld that was killed); in the CNI directories, the
  ``flannel`` launcher install-cni writes, its ``.flannel-cni*`` module directories, and
  ``10-flannel.conflist`` when it configures the flannel plugin. Run in a network namespace
  other than the host's while ``/run`` is still the host's (``ip netns exec`` into a lab
  node), the files under ``/run`` and the default CNI directories are the host's, not this
  node's: only the directories and files given by flags are looked at (``in_named_netns``).
Refuses while a flanneld runs in the same network namespace (it would recreate everything).
Not on the node, so not here: routes in a cloud's route tables and whatever a backend's
user-given commands created (docs/install.md, "Uninstall"). No backend is named here.
Must not touch: anything that fails those checks; files are never followed through symlinks.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flannel.backend import backend_class, footprints, supported
from flannel.backend.footprint import Link, Place
from flannel.cni.install import CONFLIST_NAME, LAUNCHER_MARK
from flannel.kernel import links, rtnl
from flannel.monitor.localsock import connect, socket_path
from flannel.process.procscan import running_flanneld
from flannel.rules import iptables, nftables
from flannel.rules.mode import installed
from flannel.untrusted import boundedjson

MAX_SCAN_BYTES = 64 * 1024  # files larger than this are not ours
MAX_NAMED_NETNS = 100_000  # entries of /run/netns looked at


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


# -- kernel objects --------------------------------------------------------------------------

def own_links() -> list[Link]:
    """Every device a registered backend declares it makes."""
    return list(dict.fromkeys(link for footprint in footprints().values()
                              for link in footprint.links))


def _declared(name: str, declared: list[Link]) -> Link | None:
    return next((link for link in declared if link.matches(name)), None)


_PROTOCOLS = {rtnl.RTPROT_BOOT: "boot", rtnl.RTPROT_STATIC: "static"}


def _route_text(route: rtnl.Route, names: dict[int, str], proto: int) -> str:
    said = _PROTOCOLS.get(proto, str(proto))
    if route.kind == rtnl.RTN_BLACKHOLE:
        return f"blackhole route {route.dst} metric {route.metric} proto {said}"
    text = f"route {route.dst}"
    if route.gateway:
        text += f" via {route.gateway}"
    if route.oif:
        text += f" dev {names.get(route.oif, route.oif)}"
    return text + (" onlink" if route.onlink else "") + f" proto {said}"


def kernel_items(inventory: Inventory) -> dict[str, tuple[int, str]]:
    """Our devices with their routes, neighbours and FDB entries (a device a userspace
    program serves is its backend's leftover, its routes ours); every link here, name ->
    (index, kind)."""
    declared = own_links()
    sock = rtnl.Rtnl()
    inventory.closers.append(sock.close)
    names: dict[int, str] = {}
    present: dict[str, tuple[int, str]] = {}
    devices: list[tuple[int, str, str]] = []
    entries: set[int] = set()  # devices holding our permanent neighbour and FDB entries
    userspace: dict[str, int] = {}  # devices served by a userspace program
    for details in links.dump_links(sock):
        index, name, kind = details.link.index, details.link.name or "", details.kind
        names[index] = name
        present[name] = (index, kind)
        want = _declared(name, declared)
        if want is None:
            continue
        if kind == want.kind:
            devices.append((index, name, kind))
            if want.entries:
                entries.add(index)
        elif want.userspace and kind == want.userspace and name in want.names:
            userspace[name] = index
        else:
            inventory.kept.append(f"device {name}: a {kind or 'plain'} device, not the "
                                  f"{want.kind} device flannel creates")

    def delete(obj: object) -> Callable[[], None]:
        def run() -> None:
            failures = sock.run([("delete", obj)])
            if failures:
                raise failures[0]
        return run

    ours = {index for index, _, _ in devices} | set(userspace.values())
    family: int
    for family in (socket.AF_INET, socket.AF_INET6):
        for route, proto, table in sock.routes(family):
            # Ours: flannel's protocol, or through our device; the kernel's own (address
            # prefix, link-local) go with the device and are not worth a line.
            if table == rtnl.RT_TABLE_MAIN and (proto == rtnl.RTPROT_FLANNEL or (
                    route.oif in ours and proto != rtnl.RTPROT_KERNEL)):
                inventory.items.append(Item(_route_text(route, names, proto), delete(route)))
    for index in sorted(entries):
        dev = names[index]
        for family in (socket.AF_INET, socket.AF_INET6, rtnl.AF_BRIDGE):
            for entry, state, _flags in sock.neighbours(family, index):
                if not state & rtnl.NUD_PERMANENT:
                    continue
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
    return present


def backend_items(inventory: Inventory, place: Place) -> None:
    """What every registered backend says it leaves here besides (whatever ran)."""
    for backend_type in supported():
        found = backend_class(backend_type).leftovers(place)
        inventory.items += [Item(what, remove) for what, remove in found.items]
        inventory.kept += found.kept


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


def file_items(inventory: Inventory, subnet_file: Path | None, bin_dirs: list[Path],
               conf_dirs: list[Path]) -> None:
    """Our files; a path given as None is not looked at."""
    def consider(path: Path, ours: Callable[[str], bool], why_not: str) -> None:
        if not path.exists() and not path.is_symlink():
            return
        text = _small_text(path)
        if text is not None and ours(text):
            inventory.items.append(Item(f"file {path}", _remove_file(path)))
        else:
            inventory.kept.append(f"file {path}: {why_not}")

    if subnet_file is not None:
        consider(subnet_file, is_subnet_env, "not a subnet.env written by flanneld")
        socket_item(inventory, socket_path(subnet_file))
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


def socket_item(inventory: Inventory, path: Path) -> None:
    """flanneld's socket, when it is one nobody listens on (a live one is a flanneld's,
    maybe another namespace's: not a leftover)."""
    try:
        connect(path, 1.0).close()
    except FileNotFoundError:
        pass
    except ConnectionRefusedError:
        inventory.items.append(Item(f"socket {path} (nobody listens: left by a flanneld "
                                    "that ended)", _remove_file(path)))
    except OSError as err:
        inventory.kept.append(f"{path}: not a socket flanneld left ({err.strerror or err})")


def _entries(directory: Path) -> Iterator[Path]:
    try:
        yield from sorted(directory.iterdir())
    except OSError:
        return


# -- the command -----------------------------------------------------------------------------

def inventory(subnet_file: Path | None, bin_dirs: list[Path], conf_dirs: list[Path],
              run_dir: Path = Path("/run"), key_file: Path | None = None,
              run_files: bool = True) -> Inventory:
    """Everything of ours on this node; ``run_dir`` is the node's /run (the backends'
    sockets, logs and default key file are under it). Without ``run_files``, the files under
    ``run_dir`` are not this node's: only the files named (``subnet_file``, ``key_file``,
    when not None) are looked at."""
    found = Inventory()
    present = kernel_items(found)
    backend_items(found, Place(run_dir if run_files else None, key_file, present))
    rule_items(found)
    file_items(found, subnet_file, bin_dirs, conf_dirs)
    return found


def in_named_netns(run: Path = Path("/run")) -> bool:
    """Whether this network namespace is one of those named under ``run``/netns, entered
    with ``ip netns exec`` (a lab node): the host's /run and CNI directories, which it still
    sees, are then the host's, not this node's (whose flanneld keeps its files elsewhere)."""
    try:
        own = os.stat("/proc/self/ns/net")
    except OSError:
        return False
    for entry in itertools.islice(_entries(run / "netns"), MAX_NAMED_NETNS):
        try:
            info = entry.stat()
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (own.st_dev, own.st_ino):
            return True
    return False


def same_place(a: Path, b: Path) -> bool:
    try:
        first, second = a.stat(), b.stat()
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


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
