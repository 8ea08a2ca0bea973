"""The etcd v3 subnet manager: config, lease acquisition, renewal and the lease watch.

Owns the key layout under ``<prefix>`` (``config``, ``subnets/<key>``), the acquisition
order of upstream (reuse by public IP, previous subnet, random free subnet), lease renewal,
and a watch that resumes from the last seen revision and relists after compaction.
Deliberate improvements over Go flannel, documented in docs/architecture.md: a lost creation
race is retried in-process; a key without an etcd lease is a reservation that is honoured
and never converted into a TTL lease.
Must not touch: the kernel, files (subnet.env is the daemon's business).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from flannel.config import NetworkConfig, check_network_config, parse_config
from flannel.lease import (
    NO_IPV4,
    Event,
    EventType,
    Lease,
    LeaseAttrs,
    LeaseDecodeError,
    parse_subnet_key,
)
from flannel.subnet.envfile import read_env, single_cidr
from flannel.subnet.etcdclient import (
    EtcdClient,
    EtcdCompacted,
    EtcdError,
    EtcdOptions,
    KeyValue,
    WatchEvent,
    parse_endpoints,
)
from flannel.subnet.skips import SkippedRecords
from flannel.subnet.watch import Changes, LeaseUpdate, Snapshot

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/coreos.com/network"
DEFAULT_LEASE_TTL = 24 * 3600
MAX_CANDIDATES = 100
ACQUIRE_ATTEMPTS = 10


class ConfigNotFound(EtcdError):
    """There is no network config under the prefix (or it was written with the v2 API)."""


class AcquireError(Exception):
    """No lease could be acquired; the message says why and what to do."""


@dataclass(frozen=True)
class PreviousSubnets:
    """The subnets this node had before the restart (from the old subnet.env)."""

    subnet: IPv4Network | None = None
    ipv6_subnet: IPv6Network | None = None


def _merged(nets: Sequence[IPv4Network | IPv6Network]) -> list[list[int]]:
    """The address ranges covered by ``nets``, sorted and merged."""
    merged: list[list[int]] = []
    for start, end in sorted((int(n.network_address), int(n.broadcast_address)) for n in nets):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def free_candidates(network_type: type, subnet_len: int, bits: int, subnet_min: object,
                    subnet_max: object, taken: Sequence[IPv4Network | IPv6Network],
                    limit: int = MAX_CANDIDATES) -> list:
    """Up to ``limit`` free subnets from SubnetMin to SubnetMax, skipping overlaps."""
    size = 1 << (bits - subnet_len)
    ranges = _merged(taken)
    out = []
    base, last_base, i = int(subnet_min), int(subnet_max), 0
    while base <= last_base and len(out) < limit:
        while i < len(ranges) and ranges[i][1] < base:
            i += 1
        if i < len(ranges) and ranges[i][0] < base + size:
            # Jump past the taken range instead of stepping through it.
            base = -(-(ranges[i][1] + 1) // size) * size
            continue
        out.append(network_type((base, subnet_len)))
        base += size
    return out


def _clip(subnet: IPv4Network | IPv6Network | None, subnet_len: int) -> Any:
    if subnet is None or not subnet_len or subnet.prefixlen >= subnet_len:
        return subnet
    return type(subnet)((subnet.network_address, subnet_len))


def subnet_fits(cfg: NetworkConfig, subnet: IPv4Network | None,
                ipv6_subnet: IPv6Network | None) -> bool:
    """Whether a (previous or existing) lease is valid under the current config."""
    if cfg.enable_ipv4:
        if subnet is None or subnet.prefixlen != cfg.subnet_len:
            return False
        if not cfg.subnet_min <= subnet.network_address <= cfg.subnet_max:
            return False
    if not cfg.enable_ipv6:
        return ipv6_subnet is None
    if ipv6_subnet is None or ipv6_subnet.prefixlen != cfg.ipv6_subnet_len:
        return False
    return cfg.ipv6_subnet_min <= ipv6_subnet.network_address <= cfg.ipv6_subnet_max


class EtcdSubnetManager:
    """Leases in etcd v3, wire-compatible with Go flannel."""

    name = "etcd"

    def __init__(self, client: EtcdClient, prefix: str = DEFAULT_PREFIX, *,
                 lease_ttl: int = DEFAULT_LEASE_TTL,
                 previous: PreviousSubnets | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.lease_ttl = lease_ttl
        self.previous = previous or PreviousSubnets()
        self._clock = clock
        self.undecodable = SkippedRecords("lease")

    @property
    def config_key(self) -> bytes:
        return f"{self.prefix}/config".encode()

    @property
    def subnets_prefix(self) -> bytes:
        return f"{self.prefix}/subnets/".encode()

    def lease_key(self, lease_key: str) -> bytes:
        return self.subnets_prefix + lease_key.encode()

    async def get_network_config(self) -> NetworkConfig:
        """Read and validate ``<prefix>/config``."""
        kv, _ = await self.client.get(self.config_key)
        if kv is None:
            raise ConfigNotFound(
                "flannel config not found in etcd store. Did you create your config using "
                f"etcdv3 API? (expected key {self.config_key.decode()}, e.g. "
                f"ETCDCTL_API=3 etcdctl put {self.config_key.decode()} "
                "'{\"Network\": \"10.244.0.0/16\", \"Backend\": {\"Type\": \"vxlan\"}}')")
        cfg = parse_config(kv.value)
        check_network_config(cfg)
        return cfg

    def _key_name(self, kv: KeyValue) -> str:
        return kv.key[len(self.subnets_prefix):].decode(errors="replace")

    def _subnets(self, kv: KeyValue) -> tuple[IPv4Network | None, IPv6Network | None] | None:
        subnets = parse_subnet_key(self._key_name(kv))
        if subnets is None:
            return None
        return (None if subnets[0] == NO_IPV4 else subnets[0]), subnets[1]

    def _decode(self, kv: KeyValue) -> Lease | None:
        key = self._key_name(kv)
        subnets = self._subnets(kv)
        if subnets is None:
            self.undecodable.skip(key[:100], "the key does not name a subnet")
            return None
        try:
            attrs = LeaseAttrs.from_json(kv.value)
        except LeaseDecodeError as err:
            self.undecodable.skip(key, str(err))
            return None
        self.undecodable.forget(key)
        return Lease(subnets[0], subnets[1], attrs, etcd_lease_id=kv.lease)

    async def list_leases(self) -> tuple[list[Lease], int]:
        """Every valid lease and the revision of the listing; bad entries are skipped."""
        kvs, revision = await self.client.get_prefix(self.subnets_prefix)
        leases = [lease for kv in kvs if (lease := self._decode(kv)) is not None]
        return leases, revision

    async def _put(self, subnet: IPv4Network | None, ipv6_subnet: IPv6Network | None,
                   attrs: LeaseAttrs, *, reservation: bool = False) -> Lease:
        """Write our lease unconditionally: with a fresh etcd lease, or none (reservation)."""
        lease = Lease(subnet, ipv6_subnet, attrs)
        key, value = self.lease_key(lease.key), attrs.to_json().encode()
        if reservation:
            await self.client.put(key, value)
            return lease
        lease_id, ttl = await self.client.grant(self.lease_ttl)
        try:
            await self.client.put(key, value, lease_id)
        except BaseException:
            await self._revoke_quietly(lease_id)
            raise
        return replace(lease, expiration=self._clock() + ttl, etcd_lease_id=lease_id)

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self.client.revoke(lease_id)
        except EtcdError as err:
            log.warning("could not revoke unused etcd lease %x: %s", lease_id, err)

    async def acquire_lease(self, attrs: LeaseAttrs) -> Lease:
        """Acquire a subnet for this node: reuse by public IP, previous subnet, or a new one.

        A lost creation race is retried in-process: the failed transaction returns the fresh
        listing, so each retry costs one round trip.
        """
        cfg, (kvs, _) = await asyncio.gather(self.get_network_config(),
                                             self.client.get_prefix(self.subnets_prefix))
        leases = [lease for kv in kvs if (lease := self._decode(kv)) is not None]
        reused, deleted = await self._reuse_by_public_ip(cfg, attrs, leases)
        if reused is not None:
            return reused
        # Every key that names a subnet is taken, even one whose value we cannot read.
        taken = self._taken((kv for kv in kvs if self._key_name(kv) not in deleted), cfg)
        value = attrs.to_json().encode()
        lease_id, ttl = await self.client.grant(self.lease_ttl)
        acquired = False
        try:
            for attempt in range(1, ACQUIRE_ATTEMPTS + 1):
                subnet, ipv6_subnet = self._previous_if_free(cfg, taken)
                if subnet is None and ipv6_subnet is None:
                    subnet, ipv6_subnet = self._allocate(cfg, taken)
                else:
                    log.info("Found previously leased subnet (%s), reusing",
                             subnet or ipv6_subnet)
                lease = Lease(subnet, ipv6_subnet, attrs, etcd_lease_id=lease_id)
                acquired, fresh = await self.client.create(
                    self.lease_key(lease.key), value, lease_id, else_list=self.subnets_prefix)
                if acquired:
                    log.info("Allocated lease (%s) to current node (%s)", lease.key,
                             attrs.public_ip)
                    return replace(lease, expiration=self._clock() + ttl)
                log.info("another node took the subnet first (%s); choosing again "
                         "(attempt %d of %d)", lease.key, attempt, ACQUIRE_ATTEMPTS)
                taken = self._taken(fresh, cfg)
        finally:
            if not acquired:
                await self._revoke_quietly(lease_id)
        raise AcquireError(
            f"max retries reached trying to acquire a subnet ({ACQUIRE_ATTEMPTS} lost races); "
            "many nodes are starting at once, the process can simply be restarted")

    def _taken(self, kvs: Iterable[KeyValue], cfg: NetworkConfig) -> list[Lease]:
        """The subnets named by keys (values are not read).

        A key wider than SubnetLen takes only the subnet at its base, as upstream counts
        base addresses: a stray ``0.0.0.0-1`` must not make the whole Network look taken.
        """
        return [Lease(_clip(subnets[0], cfg.subnet_len), _clip(subnets[1], cfg.ipv6_subnet_len))
                for kv in kvs if (subnets := self._subnets(kv)) is not None]

    async def _reuse_by_public_ip(self, cfg: NetworkConfig, attrs: LeaseAttrs,
                                  leases: list[Lease]) -> tuple[Lease | None, set[str]]:
        """Our existing lease rewritten with our attrs, or None and the keys of our leases
        that no longer fit the config (deleted)."""
        deleted: set[str] = set()
        # Upstream matches the IPv4 public IP; an IPv6-only node is known by its IPv6 one.
        mine = attrs.public_ip or attrs.public_ipv6
        if mine is None:
            return None, deleted
        for existing in leases:
            theirs = existing.attrs.public_ip if attrs.public_ip else existing.attrs.public_ipv6
            if theirs != mine:
                continue
            if subnet_fits(cfg, existing.subnet, existing.ipv6_subnet):
                log.info("Found lease (%s) for current IP (%s), reusing", existing.key, mine)
                return await self._put(existing.subnet, existing.ipv6_subnet, attrs,
                                       reservation=existing.is_reservation), deleted
            if existing.is_reservation:
                log.warning("reservation %s for %s does not fit the network config; leaving "
                            "it alone and allocating another subnet", existing.key, mine)
                continue
            log.info("Found lease (%s) for current IP (%s) but not compatible with current "
                     "config, deleting it", existing.key, mine)
            await self.client.delete(self.lease_key(existing.key))
            deleted.add(existing.key)
        return None, deleted

    def _previous_if_free(self, cfg: NetworkConfig, leases: list[Lease]
                          ) -> tuple[IPv4Network | None, IPv6Network | None]:
        prev = self.previous
        wanted_v6 = prev.ipv6_subnet if cfg.enable_ipv6 else None
        if prev.subnet is None and wanted_v6 is None:
            return None, None
        if not subnet_fits(cfg, prev.subnet if cfg.enable_ipv4 else None, wanted_v6):
            return None, None
        for lease in leases:
            if prev.subnet is not None and lease.subnet is not None \
                    and lease.subnet.overlaps(prev.subnet):
                return None, None
            if wanted_v6 is not None and lease.ipv6_subnet is not None \
                    and lease.ipv6_subnet.overlaps(wanted_v6):
                return None, None
        return (prev.subnet if cfg.enable_ipv4 else None), wanted_v6

    def _allocate(self, cfg: NetworkConfig, leases: list[Lease]
                  ) -> tuple[IPv4Network | None, IPv6Network | None]:
        subnet = ipv6_subnet = None
        if cfg.enable_ipv4:
            free = free_candidates(IPv4Network, cfg.subnet_len, 32, cfg.subnet_min,
                                   cfg.subnet_max, [x.subnet for x in leases if x.subnet])
            if not free:
                raise AcquireError(self._out_of_subnets(cfg, len(leases)))
            subnet = random.choice(free)
        if cfg.enable_ipv6:
            free6 = free_candidates(IPv6Network, cfg.ipv6_subnet_len, 128, cfg.ipv6_subnet_min,
                                    cfg.ipv6_subnet_max,
                                    [x.ipv6_subnet for x in leases if x.ipv6_subnet])
            if not free6:
                raise AcquireError(self._out_of_subnets(cfg, len(leases), v6=True))
            ipv6_subnet = random.choice(free6)
        return subnet, ipv6_subnet

    def _out_of_subnets(self, cfg: NetworkConfig, count: int, v6: bool = False) -> str:
        if v6:
            span = f"{cfg.ipv6_subnet_min} to {cfg.ipv6_subnet_max} (/{cfg.ipv6_subnet_len})"
        else:
            span = f"{cfg.subnet_min} to {cfg.subnet_max} (/{cfg.subnet_len})"
        return (f"out of subnets: every subnet from {span} is taken by one of {count} leases; "
                "enlarge the Network, raise SubnetLen, or delete leases of nodes that are gone "
                f"under {self.subnets_prefix.decode()}")

    async def renew_lease(self, lease: Lease) -> Lease:
        """Re-put our key with a fresh etcd lease (a reservation is left as it is)."""
        if lease.is_reservation:
            return lease
        renewed = await self._put(lease.subnet, lease.ipv6_subnet, lease.attrs)
        # The old etcd lease no longer holds a key; revoke it rather than let it linger.
        await self._revoke_quietly(lease.etcd_lease_id)
        return renewed

    def _event(self, raw: WatchEvent) -> Event | None:
        if raw.deleted:
            self.undecodable.forget(self._key_name(raw.kv))
            subnets = self._subnets(raw.kv)
            if subnets is None:
                return None
            return Event(EventType.REMOVED, Lease(subnets[0], subnets[1]))
        lease = self._decode(raw.kv)
        return Event(EventType.ADDED, lease) if lease is not None else None

    async def watch_leases(self, *, max_backoff: float = 5.0) -> AsyncIterator[LeaseUpdate]:
        """A snapshot, then changes; survives disconnects and relists after compaction."""
        leases, revision = await self._retrying(self.list_leases, max_backoff)
        yield Snapshot(leases)
        backoff = 0.1
        while True:
            try:
                async for batch in self.client.watch(self.subnets_prefix, revision + 1):
                    revision = batch.revision
                    backoff = 0.1
                    events = [ev for raw in batch.events if (ev := self._event(raw)) is not None]
                    if events:
                        yield Changes(events)
            except EtcdCompacted as err:
                log.warning("watch resumed from a compacted revision (%d < %d); relisting",
                            revision + 1, err.compact_revision)
                leases, revision = await self._retrying(self.list_leases, max_backoff)
                yield Snapshot(leases)
            except EtcdError as err:
                log.warning("lease watch interrupted (%s); resuming from revision %d in %.1fs",
                            err, revision + 1, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max_backoff)

    async def _retrying(self, operation: Callable, max_backoff: float) -> tuple:
        backoff = 0.1
        while True:
            try:
                return await operation()
            except EtcdError as err:
                log.warning("etcd request failed (%s); retrying in %.1fs", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max_backoff)

    async def public_ip_overrides(self) -> tuple[None, None]:
        return None, None

    async def complete_lease(self, lease: Lease, renew_margin: float,
                             on_renewed: Callable[[Lease], None]) -> None:
        await self.keep_lease(lease, renew_margin, on_renewed=on_renewed)

    async def close(self) -> None:
        await self.client.close()

    async def keep_lease(self, lease: Lease, renew_margin: float, *,
                         retry_interval: float = 60.0,
                         on_renewed: Callable[[Lease], None] | None = None) -> None:
        """Renew ``lease`` ``renew_margin`` seconds before each expiry, forever."""
        while lease.expiration is not None:
            delay = max(0.0, lease.expiration - renew_margin - self._clock())
            await asyncio.sleep(delay)
            try:
                lease = await self.renew_lease(lease)
            except EtcdError as err:
                log.error("Error renewing lease (trying again in %s): %s",
                          _seconds_text(retry_interval), err)
                await asyncio.sleep(retry_interval)
                continue
            log.info("Lease renewed, new expiration: %s",
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease.expiration)))
            if on_renewed is not None:
                on_renewed(lease)


def _seconds_text(seconds: float) -> str:
    return "1 min" if seconds == 60 else f"{seconds:g} s"



def make_etcd_manager(args: argparse.Namespace) -> EtcdSubnetManager:
    """The etcd subnet manager of the ``--etcd-*`` flags; EtcdOptionError names a bad one."""
    options = EtcdOptions(
        endpoints=parse_endpoints(args.etcd_endpoints),
        cafile=args.etcd_cafile, certfile=args.etcd_certfile, keyfile=args.etcd_keyfile,
        username=args.etcd_username, password=args.etcd_password,
    )
    client = EtcdClient(options)
    if not args.etcd_certfile and all(e.scheme == "http" for e in options.endpoints):
        log.warning("etcd TLS is off: use https:// etcd endpoints with --etcd-cafile (and "
                    "--etcd-certfile, --etcd-keyfile if etcd wants client certificates)")
    previous = read_env(args.subnet_file)
    return EtcdSubnetManager(
        client, args.etcd_prefix, lease_ttl=int(args.subnet_lease_ttl),
        previous=PreviousSubnets(single_cidr(previous, "FLANNEL_SUBNET", 4),
                                 single_cidr(previous, "FLANNEL_IPV6_SUBNET", 6)))
