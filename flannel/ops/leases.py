"""``flannelctl leases``: list, show, reserve and release subnet leases.

Owns reading every lease with its remaining time (etcd: the key's etcd lease TTL; a key with
no etcd lease is a reservation), and the two writes an operator may make in etcd: a
reservation (``<prefix>/subnets/<key>`` with ``{"PublicIP":...}`` and no TTL, honoured by
the next flanneld starting with that public IP) and a release (deleting a key).
Must not touch: the kernel; any key outside ``<prefix>/subnets/``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_network
from typing import TYPE_CHECKING, Any

from flannel.lease import NO_IPV4, Lease, LeaseAttrs, LeaseDecodeError, parse_subnet_key
from flannel.ops.parsers import RELEASE_EFFECT
from flannel.process.stopping import output_closed

if TYPE_CHECKING:
    from flannel.ops.options import LeasesOptions
    from flannel.subnet.etcd.manager import EtcdSubnetManager
    from flannel.subnet.manager import SubnetManager

#: How long one store round trip may take before the command gives up.
STORE_TIMEOUT = 10.0


class LeaseCommandError(Exception):
    """A lease command cannot proceed; the message says why and what to do."""


@dataclass(frozen=True)
class LeaseRow:
    """One key under ``subnets/`` as found: a lease, or why it is not one."""

    key: str
    lease: Lease | None
    ttl_left: int | None = None  # seconds; None for a reservation or an unknown TTL
    problem: str = ""
    node: str = ""  # kube mode: the Node holding it

    @property
    def expires(self) -> str:
        if self.lease is None:
            return "-"
        if self.lease.is_reservation and not self.node:
            return "never (reservation)"
        if self.ttl_left is None:
            return "unknown"
        return f"in {duration_text(self.ttl_left)}"

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"key": self.key, "problem": self.problem or None}
        if self.node:
            doc["node"] = self.node
        lease = self.lease
        if lease is not None:
            attrs = lease.attrs
            doc.update({
                "subnet": str(lease.subnet) if lease.subnet else None,
                "ipv6_subnet": str(lease.ipv6_subnet) if lease.ipv6_subnet else None,
                "public_ip": str(attrs.public_ip) if attrs.public_ip else None,
                "public_ipv6": str(attrs.public_ipv6) if attrs.public_ipv6 else None,
                "backend": attrs.backend_type or None,
                "vtep_mac": vtep_mac(lease),
                "reservation": lease.is_reservation and not self.node,
                "ttl_seconds": self.ttl_left,
            })
        return doc


def duration_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def vtep_mac(lease: Lease) -> str | None:
    """The ``VtepMAC`` a lease's backend data publishes, lower-case; None otherwise or if
    malformed."""
    try:
        data = lease.attrs.backend_json()
    except ValueError:
        return None
    mac = data.get("VtepMAC") if isinstance(data, dict) else None
    return mac.lower() if isinstance(mac, str) and len(mac) <= 64 else None


def decode_row(key: str, value: bytes, etcd_lease_id: int, created: int = 0) -> LeaseRow:
    """One key under ``subnets/``; ``created``: its create revision, the order of the
    leases' ages that flanneld reads too (``Lease.age``)."""
    subnets = parse_subnet_key(key)
    if subnets is None:
        return LeaseRow(key, None, problem=f"{key!r} is not a subnet key")
    try:
        attrs = LeaseAttrs.from_json(value)
    except LeaseDecodeError as err:
        return LeaseRow(key, None, problem=str(err))
    subnet = None if subnets[0] == NO_IPV4 else subnets[0]
    return LeaseRow(key, Lease(subnet, subnets[1], attrs, etcd_lease_id=etcd_lease_id,
                               created=created))


async def etcd_rows(manager: Any) -> list[LeaseRow]:
    """Every key under ``subnets/`` with its TTL left (queried in parallel)."""
    from flannel.subnet.etcd.kv import Refused

    kvs, _ = await manager.client.get_prefix(manager.subnets_prefix)
    start = len(manager.subnets_prefix)
    rows = [decode_row(kv.key[start:].decode(errors="replace"), kv.value, kv.lease,
                       kv.create_revision) for kv in kvs[:100_000]]

    async def ttl(row: LeaseRow) -> LeaseRow:
        if row.lease is None or row.lease.is_reservation:
            return row
        try:
            left = await manager.client.time_to_live(row.lease.etcd_lease_id)
        except Refused:  # shown as "unknown": the listing still stands
            return row
        return LeaseRow(row.key, row.lease, left if left >= 0 else None, row.problem)

    limit = asyncio.Semaphore(32)

    async def bounded(row: LeaseRow) -> LeaseRow:
        async with limit:
            return await ttl(row)

    return list(await asyncio.gather(*(bounded(row) for row in rows)))


async def kube_rows(manager: Any) -> list[LeaseRow]:
    """The lease each Node's annotations describe (a Node without one is listed too)."""
    # The manager wants this node's name (for its own lease); a listing has no own lease.
    manager.node_name = manager.node_name or socket.gethostname()
    config = await manager.get_network_config()
    await manager._relist()
    rows = []
    for name, node in sorted(manager.nodes.items()):
        lease = manager._lease_of(node, config)
        if lease is None:
            rows.append(LeaseRow("-", None, problem="no valid flannel annotations", node=name))
        else:
            rows.append(LeaseRow(lease.key, lease, node=name))
    return rows


async def list_rows(manager: Any) -> list[LeaseRow]:
    if manager.name == "etcd":
        return await etcd_rows(manager)
    return await kube_rows(manager)


def _cell(value: object) -> str:
    return "-" if value in (None, "") else str(value)


def etcd_store(manager: SubnetManager) -> EtcdSubnetManager | None:
    """The etcd store behind ``manager``, or None (its module is loaded only in etcd mode)."""
    if manager.name != "etcd":
        return None
    from flannel.subnet.etcd.manager import EtcdSubnetManager

    return manager if isinstance(manager, EtcdSubnetManager) else None


def by_address(row: LeaseRow) -> tuple[bool, int, int, int, str]:
    """Sort key: leases by their IPv4 subnet's address (IPv6-only ones after, by theirs),
    then keys that are no lease, by key."""
    lease = row.lease
    if lease is None:
        return (True, 0, 0, 0, row.key)
    subnet = lease.subnet or lease.ipv6_subnet
    if subnet is None:
        return (False, 2, 0, 0, row.key)
    return (False, subnet.version // 6, int(subnet.network_address), subnet.prefixlen, row.key)


def table(rows: list[LeaseRow]) -> str:
    kube = any(row.node for row in rows)
    header = (["NODE"] if kube else []) + ["SUBNET", "IPV6 SUBNET", "PUBLIC IP", "BACKEND",
                                            "VTEP MAC", "EXPIRES", "PROBLEM"]
    lines = [header]
    for row in sorted(rows, key=by_address):
        lease = row.lease
        cells: list[object] = [row.node] if kube else []
        if lease is None:
            cells += [row.key, "", "", "", "", row.expires]
        else:
            cells += [lease.subnet, lease.ipv6_subnet, lease.attrs.public_ip,
                      lease.attrs.backend_type, vtep_mac(lease), row.expires]
        lines.append([*(_cell(c) for c in cells), row.problem])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def find_row(rows: list[LeaseRow], wanted: str) -> LeaseRow:
    """The row a subnet (``10.5.1.0/24``), a key (``10.5.1.0-24``) or a public IP names.

    A key names its row even when no flanneld can use it (so that it can be shown and
    released)."""
    for row in rows:
        if row.key == wanted:
            return row
    try:
        subnet = ip_network(wanted.replace("-", "/", 1) if "/" not in wanted and
                            "-" in wanted else wanted, strict=False)
    except ValueError:
        raise LeaseCommandError(f"{wanted!r}: give a subnet (10.244.1.0/24), a lease key "
                                "(10.244.1.0-24) or a node's public IP") from None
    for row in rows:
        lease = row.lease
        if lease is None:
            continue
        if subnet.prefixlen == subnet.max_prefixlen and subnet.version == 4 and \
                lease.attrs.public_ip == subnet.network_address:
            return row
        if subnet in (lease.subnet, lease.ipv6_subnet):
            return row
    raise LeaseCommandError(f"no lease for {wanted}; 'flannelctl leases list' shows them all")


def show_text(row: LeaseRow, raw: bytes | None) -> str:
    lease = row.lease
    if lease is None:
        pairs_bad = [("key", row.key), ("problem", row.problem)]
        if raw is not None:
            pairs_bad.append(("value", raw.decode(errors="replace")))
        return "\n".join(f"{name + ':':17}{value}" for name, value in pairs_bad)
    attrs = lease.attrs
    pairs = [("key", row.key), ("node", row.node), ("subnet", lease.subnet),
             ("ipv6 subnet", lease.ipv6_subnet), ("public ip", attrs.public_ip),
             ("public ipv6", attrs.public_ipv6), ("backend", attrs.backend_type),
             ("backend data", attrs.backend_data), ("backend v6 data", attrs.backend_v6_data),
             ("expires", row.expires),
             ("etcd lease", f"{lease.etcd_lease_id:x}" if lease.etcd_lease_id else "")]
    if raw is not None:
        pairs.append(("value", raw.decode(errors="replace")))
    return "\n".join(f"{name + ':':17}{value}" for name, value in pairs
                     if value not in (None, ""))


def confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise LeaseCommandError("not asking on a non-interactive input: pass --yes to "
                                "confirm")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


async def reserve(manager: Any, subnet: IPv4Network, public_ip: IPv4Address) -> str:
    cfg = await manager.get_network_config()
    if cfg.network is None or not subnet.subnet_of(cfg.network):
        raise LeaseCommandError(f"{subnet} is outside the Network {cfg.network}; reserve a "
                                "subnet inside it")
    if cfg.subnet_len and subnet.prefixlen != cfg.subnet_len:
        raise LeaseCommandError(f"{subnet}: the network hands out /{cfg.subnet_len} subnets; "
                                f"reserve a /{cfg.subnet_len}")
    rows = await etcd_rows(manager)
    for row in rows:
        lease = row.lease
        if lease is None:
            continue
        if lease.subnet is not None and lease.subnet.overlaps(subnet):
            if lease.subnet == subnet and lease.attrs.public_ip == public_ip:
                if lease.is_reservation:
                    return f"{subnet} is already reserved for {public_ip}"
                break  # the node holding it now: pin the lease it has
            raise LeaseCommandError(
                f"{subnet} overlaps {lease.subnet}, leased to {lease.attrs.public_ip}; "
                "release that lease first or pick a free subnet")
        if lease.attrs.public_ip == public_ip:
            raise LeaseCommandError(
                f"{public_ip} already holds {lease.subnet}; flanneld would keep using it. "
                f"Release it first ('flannelctl leases release {lease.subnet}'), then reserve")
    key = manager.lease_key(Lease(subnet).key)
    value = LeaseAttrs(public_ip=public_ip).to_json().encode()
    await manager.client.put(key, value)
    return (f"reserved {subnet} for {public_ip} (key {key.decode()}, no expiry); the node "
            "with that public IP takes it when flanneld starts")


async def run_command(opts: LeasesOptions) -> int:
    from flannel.subnet import open_store

    manager = open_store(opts.store.store)
    try:
        etcd = etcd_store(manager)
        if opts.action in ("reserve", "release") and etcd is None:
            raise LeaseCommandError(
                f"leases {opts.action} works against etcd; in kube mode a lease is a "
                "Node's podCIDR and annotations: change them with kubectl")
        if opts.action == "list":
            rows = await asyncio.wait_for(list_rows(manager), STORE_TIMEOUT)
            if opts.json:
                print(json.dumps([row.as_json() for row in sorted(rows, key=by_address)],
                                 indent=2))
            else:
                print(table(rows) if rows else "no leases")
                print(f"store read: {opts.source}")
            return 0
        if opts.action == "show":
            rows = await asyncio.wait_for(list_rows(manager), STORE_TIMEOUT)
            row = find_row(rows, opts.target)
            raw = None
            if etcd is not None:
                kv, _ = await etcd.client.get(etcd.lease_key(row.key))
                raw = kv.value if kv is not None else None
            if opts.json:
                print(json.dumps(row.as_json(), indent=2))
            else:
                print(f"{show_text(row, raw)}\nstore read: {opts.source}")
            return 0
        print(f"store: {opts.source}")
        if opts.action == "reserve":
            assert opts.reserve is not None and opts.reserve_for is not None  # required
            print(await asyncio.wait_for(reserve(manager, opts.reserve, opts.reserve_for),
                                         STORE_TIMEOUT))
            return 0
        rows = await asyncio.wait_for(list_rows(manager), STORE_TIMEOUT)
        row = find_row(rows, opts.target)
        what = "reservation" if row.lease and row.lease.is_reservation else "lease"
        owner = (f"of {row.lease.attrs.public_ip}" if row.lease
                 else f"that no flanneld can use: {row.problem}")
        if row.lease is not None:
            print(f"{row.key} ({what} {owner}): {RELEASE_EFFECT}")
        if not confirm(f"delete the {what} {row.key} {owner}?", opts.yes):
            print("nothing deleted")
            return 1
        assert etcd is not None  # release is refused above in kube mode
        deleted = await asyncio.wait_for(
            etcd.client.delete(etcd.lease_key(row.key)), STORE_TIMEOUT)
        print(f"released {row.key} ({what} {owner})" if deleted
              else f"{row.key} was already gone")
        return 0
    finally:
        await manager.close()


def cmd_leases(opts: LeasesOptions) -> int:
    from flannel.subnet.errors import STORE_FAILURES

    failures: tuple[type[Exception], ...] = (LeaseCommandError, *STORE_FAILURES)
    try:
        return asyncio.run(run_command(opts))
    except failures as err:
        if output_closed(err):
            raise  # the reader went away: not the store's doing
        text = str(err) or "the store did not answer in time; check --etcd-endpoints"
        print(f"flannelctl leases: {text}", file=sys.stderr)
        return 1
