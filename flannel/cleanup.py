"""``flannelctl cleanup``: remove from this node everything flanneld and install-cni created.

Owns the inventory of what is ours and how each object is recognised, so that nothing else
is ever removed:
- devices by name *and* kind, as every registered backend declares them in its footprint
  (``Footprint.links``: ``flannel.<VNI>``/``flannel-v6.<VNI>`` vxlan, ``flannel.ipip`` ipip,
  ``flannel-wg``/``flannel-wg-v6`` wireguard, ``flannel<N>`` tun for udp);
- a declared device served from userspace (``Link.userspace``: wireguard-go's tun for
  ``flannel-wg``/``flannel-wg-v6``) by a wireguard-go in this network namespace (stopped,
  which removes its device and its socket ``/run/wireguard/<name>.sock``), or left without
  one (device and stale socket removed); the private key flanneld created
  (``/run/flannel/wgkey``, only when it holds a key) and wireguard-go's logs
  ``/run/flannel/<name>.log``;
- the ipsec backend's charon, when flanneld started it in this network namespace (its marker
  ``/run/flannel/ipsec/charon.pid`` names it and the process runs with flanneld's
  ``strongswan.conf``: stopped, which takes its SAs, TUN device and routes with it; another
  charon is never stopped), flanneld's files for it (``/run/flannel/ipsec``), and the XFRM
  policies of Go's shape (ESP tunnel template, reqid 11) the backend installs where the kernel
  carries ESP;
- routes carrying our protocol (151) in the main table, blackholes included, and the other
  routes through our devices (the udp and wireguard network routes), kernel ones aside;
- permanent neighbour and FDB entries on the devices declared to hold them (vxlan's);
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
Not on the node, so not here: the aws-vpc/tencent-vpc/ali-vpc/gce routes in the cloud's route
tables and whatever the extension backend's own commands created (docs/install.md,
"Uninstall").
Must not touch: anything that fails those checks; files are never followed through symlinks.
"""

from __future__ import annotations

import contextlib
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

from flannel import boundedjson, procstop
from flannel.backend import footprints
from flannel.backend.footprint import Link
from flannel.cni.install import CONFLIST_NAME, LAUNCHER_MARK
from flannel.ipsec import charon, xfrm
from flannel.ipsec.config import REQID
from flannel.kernel import links, rtnl
from flannel.monitor.localsock import connect, socket_path
from flannel.procscan import processes_here, running_flanneld
from flannel.rules import iptables, nftables
from flannel.rules.mode import installed
from flannel.wireguard.keys import KeyFileError, parse_key
from flannel.wireguard.uapi import UapiControl, is_stale_socket

MAX_SCAN_BYTES = 64 * 1024  # files larger than this are not ours
STOP_TIMEOUT = 5.0  # for a wireguard-go or charon to exit on SIGTERM before it gets SIGKILL
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


def userspace_devices(declared: list[Link]) -> list[str]:
    """The device names a userspace program (wireguard-go) may serve."""
    return [name for link in declared if link.userspace for name in link.names]


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


def kernel_items(inventory: Inventory, run_dir: Path | None = Path("/run")) -> None:
    """Our devices with their routes, neighbours and FDB entries; wireguard-go (whose
    sockets are under ``run_dir``/wireguard; None: not this node's /run)."""
    declared = own_links()
    sock = rtnl.Rtnl()
    inventory.closers.append(sock.close)
    names: dict[int, str] = {}
    devices: list[tuple[int, str, str]] = []
    entries: set[int] = set()  # devices holding our permanent neighbour and FDB entries
    userspace: dict[str, int] = {}  # devices served by a userspace program (wireguard-go)
    for details in links.dump_links(sock):
        index, name, kind = details.link.index, details.link.name or "", details.kind
        names[index] = name
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

    def delete_tun(name: str) -> Callable[[], None]:
        def run() -> None:  # by name: when its wireguard-go stopped, it went with it
            found = links.get_link(sock, name)
            if found is not None and found.kind == "tun":
                links.delete_link(sock, found.link.index, "delete the device")
        return run

    for name in userspace_devices(declared):
        wireguard_go_items(inventory, name, name in userspace,
                           run_dir / "wireguard" if run_dir is not None else None,
                           delete_tun(name))


# -- userspace WireGuard ---------------------------------------------------------------------

def _same_netns(pid: int) -> bool:
    try:
        theirs = os.stat(f"/proc/{pid}/ns/net")
        own = os.stat("/proc/self/ns/net")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (own.st_dev, own.st_ino)


def _wireguard_go_argv(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [arg for arg in handle.read(4096).split(b"\0") if arg]
    except OSError:
        return []


def _stop_wireguard_go(pid: int, socket_path: Path | None, then: Callable[[], None]) -> None:
    """SIGTERM (wireguard-go then removes its device and socket), SIGKILL after
    STOP_TIMEOUT; then whatever it left: ``then`` (its device) and a stale socket."""
    stopped = procstop.stop(pid, STOP_TIMEOUT)
    then()
    if socket_path is not None and is_stale_socket(socket_path):
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
    if not stopped:
        raise OSError(f"wireguard-go {pid} did not stop")


def _serves(name: str) -> Callable[[bytes], bool]:
    def matches(cmdline: bytes) -> bool:
        argv = [arg for arg in cmdline.split(b"\0") if arg]
        return bool(argv) and os.path.basename(argv[0]) == b"wireguard-go" \
            and name.encode() in argv
    return matches


def wireguard_go_items(inventory: Inventory, name: str, has_device: bool,
                       socket_dir: Path | None, delete_device: Callable[[], None]) -> None:
    """The wireguard-go serving ``name`` in this network namespace, its tun device (when
    ``has_device``) and its socket in ``socket_dir`` (None: its socket is out of sight, so
    the process is found by its command line)."""
    if socket_dir is None:
        pids = processes_here(_serves(name)) if has_device else []
        if pids:
            inventory.items.append(Item(
                f"wireguard-go process {pids[0]} serving {name} (its device goes with it)",
                functools.partial(_stop_wireguard_go, pids[0], None, delete_device)))
        elif has_device:
            inventory.items.append(Item(f"device {name} (tun: its wireguard-go is gone)",
                                        delete_device))
        return
    socket_path = socket_dir / f"{name}.sock"
    control = UapiControl(socket_path, timeout=1.0)
    pid = control.peer_pid() if control.answers() else None
    argv = _wireguard_go_argv(pid) if pid else []
    serves_us = bool(argv) and os.path.basename(argv[0]) == b"wireguard-go" \
        and name.encode() in argv and _same_netns(pid or 0)

    if pid and serves_us:
        inventory.items.append(Item(
            f"wireguard-go process {pid} serving {name} (socket {socket_path}; its device "
            "goes with it)", functools.partial(_stop_wireguard_go, pid, socket_path,
                                               delete_device)))
        return
    if pid:
        inventory.kept.append(f"socket {socket_path}: served by process {pid}, not a "
                              f"wireguard-go for {name} in this network namespace")
    if has_device:
        inventory.items.append(Item(f"device {name} (tun: its wireguard-go is gone)",
                                    delete_device))
    if is_stale_socket(socket_path):
        inventory.items.append(Item(f"stale socket {socket_path} (its wireguard-go is gone)",
                                    _remove_file(socket_path)))


# -- the ipsec backend's charon and XFRM policies -------------------------------------------

def ipsec_items(inventory: Inventory, run_dir: Path | None) -> None:
    """Our charon and its directory under ``run_dir``/flannel/ipsec (None: not this node's
    /run), and XFRM policies of Go's shape."""
    state = run_dir / "flannel" / "ipsec" if run_dir is not None else None
    pid = charon.our_pid(state) if state is not None else None
    if pid is not None and _same_netns(pid):
        inventory.items.append(Item(f"charon process {pid} (started by flanneld's ipsec "
                                    "backend; its SAs, TUN device and routes go with it)",
                                    functools.partial(_stop_charon, pid)))
    elif pid is not None:
        inventory.kept.append(f"charon process {pid}: flanneld's, but in another network "
                              "namespace")
    if state is not None and state.is_dir() and not state.is_symlink():
        if all(entry.is_file() and not entry.is_symlink() for entry in _entries(state)):
            inventory.items.append(Item(f"directory {state}",
                                        functools.partial(shutil.rmtree, state)))
        else:
            inventory.kept.append(f"{state}: holds something other than flanneld's files")
    try:
        policies = xfrm.our_policies(None)
    except xfrm.XfrmError:
        return  # no iproute2 or no XFRM in this kernel: nothing of ours there
    for argv in policies:
        inventory.items.append(Item(f"XFRM policy {' '.join(argv[2:])} (ESP tunnel, reqid "
                                    f"{REQID})", functools.partial(_delete_policy, argv)))


def _stop_charon(pid: int) -> None:
    if not charon.stop(pid, STOP_TIMEOUT):
        raise OSError(f"charon {pid} did not stop")


def _delete_policy(argv: list[str]) -> None:
    try:
        xfrm.run(argv, None)
    except xfrm.XfrmError as err:
        raise OSError(str(err)) from None


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


def is_wireguard_key(text: str) -> bool:
    try:
        parse_key(text, "the file")
    except KeyFileError:
        return False
    return True


def file_items(inventory: Inventory, subnet_file: Path | None, bin_dirs: list[Path],
               conf_dirs: list[Path], wireguard_key: Path | None,
               run_dir: Path | None = Path("/run")) -> None:
    """Our files; a path given as None (``run_dir``: wireguard-go's logs) is not looked at."""
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
    if wireguard_key is not None:
        consider(wireguard_key, is_wireguard_key, "does not hold a WireGuard key")
    logs = [run_dir / "flannel" / f"{name}.log" for name in userspace_devices(own_links())] \
        if run_dir is not None else []
    for log in logs:  # wireguard-go's output (flannel/wireguard/device.py)
        try:
            regular = stat.S_ISREG(log.lstat().st_mode)
        except OSError:
            continue
        if regular:
            inventory.items.append(Item(f"file {log}", _remove_file(log)))
        else:
            inventory.kept.append(f"{log}: not a regular file")
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
              run_dir: Path = Path("/run"), wireguard_key: Path | None = None,
              run_files: bool = True) -> Inventory:
    """Everything of ours on this node; ``run_dir`` is the node's /run (wireguard-go's
    sockets, its logs and the default key file are under it). Without ``run_files``, the
    files under ``run_dir`` are not this node's: only the files named (``subnet_file``,
    ``wireguard_key``, when not None) are looked at."""
    found = Inventory()
    kernel_items(found, run_dir if run_files else None)
    ipsec_items(found, run_dir if run_files else None)
    rule_items(found)
    key = wireguard_key or (run_dir / "flannel" / "wgkey" if run_files else None)
    file_items(found, subnet_file, bin_dirs, conf_dirs, key, run_dir if run_files else None)
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
