"""The etcd v3 subnet manager: config, lease acquisition, renewal and the lease watch.

Owns the key layout under ``<prefix>`` (``config``, ``subnets/<key>``), the acquisition
order of upstream (reuse by public IP, previous subnet, a free subnet), lease renewal,
a watch that resumes from the last seen revision and relists after compaction, and the
recovery from a wiped or restored store (detected by the client's cluster ID and revision
checks, or our own key vanishing without a deletion): relist, re-create our lease with the
same subnet if it is free, and report not-ready meanwhile (``status``).
Deliberate improvements over Go flannel, documented in docs/architecture.md: a lost creation
race is retried in-process; a new subnet is looked for from a point hashed from the node's
public IP, not at random among the first 100 free ones; a key without an etcd lease is a
reservation that is honoured and never converted into a TTL lease.
Must not touch: the kernel, files (subnet.env is the daemon's business).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import posixpath
import re
import time
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from typing import NoReturn

from flannel.clients.etcd import (
    PAGE,
    Code,
    EtcdClient,
    EtcdOptions,
    KeyValue,
    WatchBatch,
    WatchEvent,
    parse_endpoints,
)
from flannel.config import NetworkConfig, check_network_config, parse_config
from flannel.lease import (
    Event,
    EventType,
    Lease,
    LeaseAttrs,
    LeaseDecodeError,
    subnet_key_numbers,
)
from flannel.log import V1, V4
from flannel.reporting.skips import SkippedRecords
from flannel.settings import EtcdSettings
from flannel.subnet.envfile import read_env, single_cidr
from flannel.subnet.errors import OwnLeaseRevoked, RetryLog, StoreError, StoreUnavailable
from flannel.subnet.etcd.candidates import Range, address_range, free_subnet, node_seed
from flannel.subnet.etcd.kv import KV, AnswerTooLarge, Compacted, EtcdKV, Refused
from flannel.subnet.manager import StoreStatus
from flannel.subnet.watch import Changes, LeaseUpdate, Snapshot
from flannel.timing.backoff import Backoff
from flannel.timing.clock import SYSTEM, Clock

#: The subnets a key names: IPv4 as (first address, prefix length), None for an IPv6-only
#: lease, and IPv6 (None if absent).
Subnets = tuple[tuple[int, int] | None, IPv6Network | None]
#: The addresses a key takes from the allocation: IPv4 and IPv6 (first, last), or None.
Taken = tuple[Range | None, Range | None]

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/coreos.com/network"
DEFAULT_LEASE_TTL = 24 * 3600
MAX_LEASE_TTL = 9_000_000_000  # etcd's MaxLeaseTTL
ACQUIRE_ATTEMPTS = 10
CHECK_INTERVAL = 5.0
RESET_GRACE = 30.0
#: A watch stream that lived this long was healthy: the next one opens after the first
#: delay. Shorter ones (etcd, or whatever answers in its place, ending or breaking every
#: stream right after confirming it) back off, as do relists after compaction.
WATCH_HEALTHY = 30.0
#: Leases decoded between two yields to the event loop (~25 ms of work).
DECODE_SLICE = 1000


def go_path_join(*elements: str) -> str:
    """Go's ``path.Join``, which upstream uses to make every key from ``--etcd-prefix``:
    empty elements are dropped and the result is cleaned (repeated slashes collapsed, ``.``
    and ``..`` resolved), so a prefix without a leading slash gives keys without one."""
    joined = "/".join(e for e in elements if e)
    if not joined:
        return ""
    # posixpath keeps a leading "//" (POSIX leaves it implementation-defined); Go does not.
    return posixpath.normpath(re.sub("/+", "/", joined))


class ConfigNotFound(StoreUnavailable):
    """There is no network config under the prefix (or it was written with the v2 API)."""


class AcquireError(StoreError):
    """No lease could be acquired; the message says why and what to do."""


class LeaseTaken(StoreError):
    """After a store reset, our subnet belongs to another node: we must not keep using it."""


@dataclass(frozen=True)
class PreviousSubnets:
    """The subnets this node had before the restart (from the old subnet.env)."""

    subnet: IPv4Network | None = None
    ipv6_subnet: IPv6Network | None = None


def _clip(first: int, prefixlen: int, subnet_len: int, bits: int) -> Range:
    """The addresses a key's subnet takes: a key wider than SubnetLen only its first
    subnet of SubnetLen."""
    if subnet_len and prefixlen < subnet_len:
        prefixlen = subnet_len
    return first, first | ((1 << (bits - prefixlen)) - 1)


def subnet_fits(cfg: NetworkConfig, subnet: IPv4Network | None,
                ipv6_subnet: IPv6Network | None) -> bool:
    """Whether a (previous or existing) lease is valid under the current config."""
    if cfg.enable_ipv4:
        if subnet is None or subnet.prefixlen != cfg.subnet_len:
            return False
        # parse_config sets the range of every enabled family.
        assert cfg.subnet_min is not None and cfg.subnet_max is not None
        if not cfg.subnet_min <= subnet.network_address <= cfg.subnet_max:
            return False
    if not cfg.enable_ipv6:
        return ipv6_subnet is None
    if ipv6_subnet is None or ipv6_subnet.prefixlen != cfg.ipv6_subnet_len:
        return False
    assert cfg.ipv6_subnet_min is not None and cfg.ipv6_subnet_max is not None
    return cfg.ipv6_subnet_min <= ipv6_subnet.network_address <= cfg.ipv6_subnet_max


class EtcdSubnetManager:
    """Leases in etcd v3, wire-compatible with Go flannel, read and written through ``kv``
    (``EtcdKV`` over the etcd client, or the fast lane's in-memory etcd). Every delay it
    measures or waits out is on ``clock``."""

    name = "etcd"
    revocable = True  # our key deleted: the lease was revoked (flanneld stops, as Go)

    def __init__(self, kv: KV, prefix: str = DEFAULT_PREFIX, *,
                 lease_ttl: int = DEFAULT_LEASE_TTL,
                 renew_margin: float = 3600.0,
                 renew_retry: float = 60.0,
                 previous: PreviousSubnets | None = None,
                 clock: Clock = SYSTEM,
                 check_interval: float = CHECK_INTERVAL,
                 reset_grace: float = RESET_GRACE) -> None:
        self.client = kv
        self.prefix = prefix
        self.lease_ttl = lease_ttl
        self.renew_margin = renew_margin
        self.renew_retry = renew_retry
        self.previous = previous or PreviousSubnets()
        self.clock = clock
        self.undecodable = SkippedRecords("lease")
        self.check_interval = check_interval
        self.reset_grace = reset_grace
        self.status = StoreStatus()
        # Our lease as it is in etcd now (renewals and a reset recovery replace it).
        self._own: Lease | None = None
        self._own_lock = asyncio.Lock()
        self._own_replaced = asyncio.Event()
        self._own_deleted = False
        self._missing_checks = 0
        # Every remote lease the watch has reported, to bridge a reset (see _recover).
        self._known: dict[str, Lease] = {}
        # The acquisition's listing, when the store after our creation is exactly it plus our
        # lease: the lease watch's first snapshot (see _first_snapshot).
        self._acquired_listing: _Listing | None = None

    @property
    def lease(self) -> Lease | None:
        """Our lease as it is in etcd now."""
        return self._own

    @functools.cached_property
    def config_key(self) -> bytes:
        return go_path_join(self.prefix, "config").encode()

    @functools.cached_property
    def subnets_prefix(self) -> bytes:
        # Go lists "<prefix>/subnets" as a bare key prefix, which also takes in
        # "<prefix>/subnets-old/...": the trailing slash keeps to the subnets directory.
        # Made once: a listing of 5000 leases asks for it 20,000 times.
        return (go_path_join(self.prefix, "subnets") + "/").encode()

    def lease_key(self, lease_key: str) -> bytes:
        return self.subnets_prefix + lease_key.encode()

    async def raw_config(self) -> bytes | None:
        """``<prefix>/config`` as stored, unchecked (None when absent): for reports."""
        kv, _ = await self.client.get(self.config_key)
        return None if kv is None else kv.value

    async def get_network_config(self) -> NetworkConfig:
        """Read and validate ``<prefix>/config``."""
        raw = await self.raw_config()
        if raw is None:
            raise ConfigNotFound(
                "flannel config not found in etcd store. Did you create your config using "
                f"etcdv3 API? (expected key {self.config_key.decode()}, e.g. "
                f"ETCDCTL_API=3 etcdctl put {self.config_key.decode()} "
                "'{\"Network\": \"10.244.0.0/16\", \"Backend\": {\"Type\": \"vxlan\"}}')")
        cfg = parse_config(raw)
        check_network_config(cfg)
        return cfg

    def _key_name(self, kv: KeyValue) -> str:
        return kv.key[len(self.subnets_prefix):].decode(errors="replace")

    def _subnets(self, kv: KeyValue, key: str | None = None) -> Subnets | None:
        numbers = subnet_key_numbers(self._key_name(kv) if key is None else key)
        if numbers is None:
            return None
        v4_base, v4_prefix, ipv6_subnet = numbers
        # 0.0.0.0-0: an IPv6-only lease (NO_IPV4).
        return (None if v4_base == v4_prefix == 0 else (v4_base, v4_prefix)), ipv6_subnet

    def _decode(self, kv: KeyValue) -> Lease | None:
        key = self._key_name(kv)
        subnets = self._subnets(kv, key)
        if subnets is None:
            self.undecodable.skip(key[:100], "the key does not name a subnet")
            return None
        if kv.oversize:
            self.undecodable.skip(key, f"its value is larger than a page of the listing may be "
                                       f"({PAGE.max_bytes} bytes)")
            return None
        try:
            attrs = LeaseAttrs.from_json(kv.value)
        except LeaseDecodeError as err:
            self.undecodable.skip(key, str(err))
            return None
        self.undecodable.forget(key)
        return Lease.from_numbers(subnets[0], subnets[1], attrs, etcd_lease_id=kv.lease,
                                  created=kv.create_revision)

    async def list_leases(self) -> tuple[list[Lease], int]:
        """Every valid lease and the revision of the listing; bad entries are skipped."""
        kvs, revision = await self.client.get_prefix(self.subnets_prefix)
        return await self._decode_all(kvs), revision

    async def _decode_all(self, kvs: Iterable[KeyValue]) -> list[Lease]:
        """The valid leases among ``kvs``, decoded a slice at a time: 100,000 leases take
        seconds, during which a signal or a cancellation must still get through."""
        leases = []
        for count, kv in enumerate(kvs, 1):
            if (lease := self._decode(kv)) is not None:
                leases.append(lease)
            if count % DECODE_SLICE == 0:
                await asyncio.sleep(0)
        return leases

    async def _put(self, subnet: IPv4Network | None, ipv6_subnet: IPv6Network | None,
                   attrs: LeaseAttrs, *, reservation: bool = False) -> Lease:
        """Write our lease unconditionally: with a fresh etcd lease, or none (reservation)."""
        lease = Lease(subnet, ipv6_subnet, attrs)
        key, value = self.lease_key(lease.key), attrs.to_json().encode()
        if reservation:
            await self.client.put(key, value)
            return lease
        lease_id, ttl = await self._grant()
        try:
            await self.client.put(key, value, lease_id)
        except BaseException:
            await self._revoke_quietly(lease_id)
            raise
        return lease.replace(expiration=self.clock.time() + ttl, etcd_lease_id=lease_id)

    async def _grant(self) -> tuple[int, int]:
        """A fresh etcd lease of ``lease_ttl``; a TTL etcd refuses names the flag to fix."""
        ttl = self.lease_ttl
        refused = (f"etcd refuses a subnet lease TTL of {ttl} s: set --subnet-lease-ttl "
                   f"between 1s and {MAX_LEASE_TTL}s (the default is 24h)")
        if not 0 < ttl < 1 << 63:
            raise StoreError(refused)
        try:
            return await self.client.grant(ttl)
        except Refused as err:
            if err.code == Code.OUT_OF_RANGE:
                raise StoreError(refused) from None
            raise

    async def _revoke_quietly(self, lease_id: int) -> None:
        """Revoke an etcd lease we no longer use; one that outlives a failure expires on
        its own. While flanneld stops (this task cancelled), at most 1 s is spent on it."""
        task = asyncio.current_task()
        try:
            async with asyncio.timeout(1 if task is not None and task.cancelling() else None):
                await self.client.revoke(lease_id)
        except (StoreError, StoreUnavailable, TimeoutError) as err:
            log.warning("could not revoke unused etcd lease %x: %s", lease_id,
                        err or "flanneld is stopping")

    async def acquire_lease(self, config: NetworkConfig, attrs: LeaseAttrs) -> Lease:
        """Acquire a subnet for this node: reuse by public IP, previous subnet, or a new one.

        A lost creation race is retried in-process: the failed transaction returns the fresh
        listing, so each retry costs one round trip. Raises StoreUnavailable when retrying
        later may help; StoreError (AcquireError included) or ConfigError when it will not.
        """
        self._acquired_listing = None
        lease = await self._acquire(config, attrs)
        self._own, self._own_deleted = lease, False
        return lease

    async def _acquire(self, cfg: NetworkConfig, attrs: LeaseAttrs) -> Lease:
        kvs, listed_at = await self.client.get_prefix(self.subnets_prefix)
        leases = await self._decode_all(_may_name(kvs, attrs))
        reused, deleted = await self._reuse_by_public_ip(cfg, attrs, leases)
        if reused is not None:
            return reused
        # Every key that names a subnet is taken, even one whose value we cannot read.
        taken = self._taken((kv for kv in kvs if self._key_name(kv) not in deleted), cfg)
        value = attrs.to_json().encode()
        lease_id, ttl = await self._grant()
        acquired = False
        try:
            for attempt in range(1, ACQUIRE_ATTEMPTS + 1):
                subnet, ipv6_subnet = self._previous_if_free(cfg, taken)
                if subnet is None and ipv6_subnet is None:
                    subnet, ipv6_subnet = self._allocate(cfg, taken, attrs, attempt)
                else:
                    log.info("Found previously leased subnet (%s), reusing",
                             subnet or ipv6_subnet)
                lease = Lease(subnet, ipv6_subnet, attrs, etcd_lease_id=lease_id)
                key = self.lease_key(lease.key)
                acquired, fresh, written_at = await self.client.create(
                    key, value, lease_id, else_list=self.subnets_prefix)
                if acquired:
                    log.info("Allocated lease (%s) to current node (%s)", lease.key,
                             attrs.public_ip)
                    lease = lease.replace(expiration=self.clock.time() + ttl)
                    if written_at == listed_at + 1:
                        # Nothing was written between the listing and our creation.
                        record = KeyValue(key, value, lease_id, written_at, written_at)
                        self._acquired_listing = _Listing([*kvs, record], written_at, lease)
                    return lease
                log.info("another node took the subnet first (%s); choosing again "
                         "(attempt %d of %d)", lease.key, attempt, ACQUIRE_ATTEMPTS)
                taken = self._taken(fresh, cfg)
        finally:
            if not acquired:
                await self._revoke_quietly(lease_id)
        raise AcquireError(
            f"max retries reached trying to acquire a subnet ({ACQUIRE_ATTEMPTS} lost races); "
            "many nodes are starting at once, the process can simply be restarted")

    def _taken(self, kvs: Iterable[KeyValue], cfg: NetworkConfig) -> list[Taken]:
        """The address ranges named by keys (values are not read), as integers: no network
        object per key.

        A key wider than SubnetLen takes only the subnet at its base, as upstream counts
        base addresses: a stray ``0.0.0.0-1`` must not make the whole Network look taken.
        """
        taken: list[Taken] = []
        for kv in kvs:
            if (subnets := self._subnets(kv)) is None:
                continue
            v4, v6 = subnets
            taken.append((
                None if v4 is None else _clip(v4[0], v4[1], cfg.subnet_len, 32),
                None if v6 is None else _clip(int(v6.network_address), v6.prefixlen,
                                              cfg.ipv6_subnet_len, 128)))
        return taken

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

    def _previous_if_free(self, cfg: NetworkConfig, taken: list[Taken]
                          ) -> tuple[IPv4Network | None, IPv6Network | None]:
        prev = self.previous
        wanted_v6 = prev.ipv6_subnet if cfg.enable_ipv6 else None
        if prev.subnet is None and wanted_v6 is None:
            return None, None
        if not subnet_fits(cfg, prev.subnet if cfg.enable_ipv4 else None, wanted_v6):
            return None, None
        wanted = (None if prev.subnet is None else address_range(prev.subnet),
                  None if wanted_v6 is None else address_range(wanted_v6))
        for ranges in taken:
            for theirs, ours in zip(ranges, wanted, strict=True):
                if theirs is not None and ours is not None \
                        and theirs[0] <= ours[1] and ours[0] <= theirs[1]:
                    return None, None
        return (prev.subnet if cfg.enable_ipv4 else None), wanted_v6

    def _allocate(self, cfg: NetworkConfig, taken: list[Taken], attrs: LeaseAttrs,
                  attempt: int) -> tuple[IPv4Network | None, IPv6Network | None]:
        """A free subnet at a point derived from our public IP and the attempt number, so
        simultaneous nodes rarely race for the same key (see flannel/subnet/etcd/candidates.py)."""
        seed = node_seed(attrs.public_ip, attrs.public_ipv6)
        subnet = ipv6_subnet = None
        if cfg.enable_ipv4:
            # parse_config sets the range of every enabled family.
            assert cfg.subnet_min is not None and cfg.subnet_max is not None
            subnet = free_subnet(IPv4Network, cfg.subnet_len, 32, cfg.subnet_min,
                                 cfg.subnet_max, [v4 for v4, _ in taken if v4 is not None],
                                 seed, attempt)
            if subnet is None:
                raise AcquireError(self._out_of_subnets(cfg, len(taken)))
        if cfg.enable_ipv6:
            assert cfg.ipv6_subnet_min is not None and cfg.ipv6_subnet_max is not None
            ipv6_subnet = free_subnet(IPv6Network, cfg.ipv6_subnet_len, 128,
                                      cfg.ipv6_subnet_min, cfg.ipv6_subnet_max,
                                      [v6 for _, v6 in taken if v6 is not None], seed, attempt)
            if ipv6_subnet is None:
                raise AcquireError(self._out_of_subnets(cfg, len(taken), v6=True))
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
        if self._own is not None and self._own.same_subnet(lease):
            self._own = renewed
        # The old etcd lease no longer holds a key; revoke it rather than let it linger.
        await self._revoke_quietly(lease.etcd_lease_id)
        return renewed

    def _event(self, raw: WatchEvent) -> Event | None:
        if raw.deleted:
            self.undecodable.forget(self._key_name(raw.kv))
            subnets = self._subnets(raw.kv)
            if subnets is None:
                return None
            return Event(EventType.REMOVED, Lease.from_numbers(subnets[0], subnets[1]))
        lease = self._decode(raw.kv)
        return Event(EventType.ADDED, lease) if lease is not None else None

    def _is_own_key(self, kv: KeyValue) -> bool:
        own = self._own
        return own is not None and kv.key == self.lease_key(own.key)

    def _remember(self, update: LeaseUpdate) -> None:
        if isinstance(update, Snapshot):
            self._known = {lease.key: lease for lease in update.leases}
            return
        for event in update.events:
            if event.type is EventType.ADDED:
                self._known[event.lease.key] = event.lease
            else:
                self._known.pop(event.lease.key, None)

    async def watch_leases(self, config: NetworkConfig | None = None, *,
                           max_backoff: float = 5.0) -> AsyncGenerator[LeaseUpdate, None]:
        """A snapshot, then changes; survives disconnects, relists after compaction, and
        recovers from a wiped or restored store (see ``_recover``). Every key under the
        prefix is reported whatever ``config`` says (the daemon's ``LeaseWatcher`` filters)."""
        reason = self.client.take_reset()
        first = await self._first_snapshot() if reason is None else None
        snapshot, revision = (first if first is not None
                              else await self._resync(max_backoff, reason))
        self._remember(snapshot)
        yield snapshot
        self._settled()
        backoff = Backoff(0.1, max_backoff, clock=self.clock)
        prune_at: float | None = None
        while True:
            queue: asyncio.Queue[WatchBatch | Exception] = asyncio.Queue(maxsize=16)
            arrived = asyncio.Event()
            pump = asyncio.create_task(self._pump(revision + 1, queue, arrived),
                                       name="etcd watch")
            opened = self.clock.monotonic()
            try:
                while True:
                    timeout = self.check_interval
                    if prune_at is not None:
                        timeout = max(0.0, min(timeout, prune_at - self.clock.monotonic()))
                    if queue.empty():
                        arrived.clear()
                        await self.clock.wait(arrived, timeout)
                    item = None if queue.empty() else queue.get_nowait()
                    if isinstance(item, Exception):
                        raise item
                    if prune_at is not None and self.clock.monotonic() >= prune_at:
                        # The grace after a reset is over: forget nodes that did not return.
                        prune_at = None
                        snapshot, revision = await self._resync(max_backoff)
                        self._remember(snapshot)
                        yield snapshot
                        self._settled()
                        break
                    if item is not None:
                        self.status.watching = True
                    if item is not None and item.progress:
                        revision = await self._progress(revision, item.revision)
                        continue
                    if item is None or item.created:
                        reason = await self._check()
                        if reason is not None:
                            snapshot, revision = await self._resync(max_backoff, reason)
                            prune_at = self.clock.monotonic() + self.reset_grace
                            self._remember(snapshot)
                            yield snapshot
                            self._settled()
                            break
                        continue
                    revision = item.revision
                    if any(raw.deleted and self._is_own_key(raw.kv) for raw in item.events):
                        self._own_deleted = True
                    events = [ev for raw in item.events if (ev := self._event(raw)) is not None]
                    if events:
                        update = Changes(events)
                        self._remember(update)
                        yield update
            except (Compacted, AnswerTooLarge) as err:
                self._healthy(opened, backoff)
                if isinstance(err, Compacted):
                    self.status.compactions += 1
                    log.warning("watch resumed from a compacted revision (%d < %d); relisting "
                                "in %.1fs", revision + 1, err.compact_revision, backoff.delay)
                else:
                    self.status.reconnects += 1
                    log.warning("lease watch: %s; relisting in %.1fs (the listing reads it in "
                                "pages)", err, backoff.delay)
                await backoff.wait()
                snapshot, revision = await self._resync(max_backoff)
                self._remember(snapshot)
                yield snapshot
                self._settled()
            except StoreUnavailable as err:
                self._healthy(opened, backoff)
                self.status.watching = False
                self.status.reconnects += 1
                log.warning("lease watch interrupted (%s); resuming from revision %d in %.1fs",
                            err, revision + 1, backoff.delay)
                await backoff.wait()
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)

    def _healthy(self, opened: float, backoff: Backoff) -> None:
        """A stream that lived WATCH_HEALTHY seconds ended: the next waits the first delay.
        Not on its confirmation: one that breaks right after it would be reopened ten times
        a second."""
        if self.clock.monotonic() - opened >= WATCH_HEALTHY:
            backoff.reset()

    async def _progress(self, revision: int, reported: int) -> int:
        """The revision to resume from after a progress notification that says the stream
        has read up to ``reported``. Taken only once a linearizable read shows the store got
        there: a revision ahead of the store would be taken as the floor of the next reads
        (the store would look wiped) and resume the watch past events it never sent.
        StoreUnavailable (the stream is broken) when the store is behind it."""
        if reported <= self.client.revision:
            return max(revision, reported)
        try:
            await self.client.get(self.config_key)
        except (StoreUnavailable, StoreError) as err:
            log.log(V1, "could not check the watch's progress revision %d: %s", reported, err)
            return revision
        if reported <= self.client.revision:
            return max(revision, reported)
        raise StoreUnavailable(
            f"the watch says it has read up to revision {reported}, ahead of the store's "
            f"{self.client.revision}: not taken (a broken proxy or gateway in front of "
            "etcd?)")

    async def _first_snapshot(self) -> tuple[Snapshot, int] | None:
        """The store as our creation left it (taken once): the acquisition's listing, in
        which nothing was under our key, plus our record, at the revision of our creation
        (the next after the listing's). The watch resumes after it, so any write since is
        replayed, and a compacted revision makes it relist. None when a full listing is
        needed: no such listing, or our lease changed since."""
        listing, self._acquired_listing = self._acquired_listing, None
        if listing is None or self._own is not listing.own or self._own_deleted:
            return None
        leases = await self._decode_all(listing.kvs)
        self.status.relists += 1
        return Snapshot(leases), listing.revision

    def _settled(self) -> None:
        """The consumer has applied the snapshot that ends a recovery: ready again."""
        self.status.set(True)

    async def _pump(self, start_revision: int, queue: asyncio.Queue[WatchBatch | Exception],
                    arrived: asyncio.Event) -> None:
        """Feed one watch stream into ``queue`` (setting ``arrived`` after each item),
        ending with the error that broke it."""
        log.log(V4, "watching %s from revision %d", self.subnets_prefix.decode(errors="replace"),
                start_revision)
        try:
            async for batch in self.client.watch(self.subnets_prefix, start_revision):
                await queue.put(batch)
                arrived.set()
            await queue.put(StoreUnavailable("the watch stream ended"))
        except Exception as err:
            # Store errors end this stream; anything else is a bug, which the consumer raises:
            # a pump that died quietly would leave the watch stalled with no error anywhere.
            await queue.put(err)
        arrived.set()

    async def _check(self) -> str | None:
        """Why the store looks wiped or restored, if it does: a linearizable read of our key
        (its header carries the cluster ID and revision the client compares)."""
        own = self._own
        try:
            kv, _ = await self.client.get(self.lease_key(own.key) if own else self.config_key)
        except (StoreUnavailable, StoreError) as err:
            log.log(V1, "store check failed (the watch reports outages): %s", err)
            return None
        reason = self.client.take_reset()
        if reason is not None or own is None or self._own_deleted or kv is not None:
            self._missing_checks = 0
            if reason is None and own is not None and kv is not None:
                return self._not_ours(own, self._decode(kv))
            return reason
        # A deliberate deletion reaches us through the watch at once and stops the node;
        # gone twice in a row without one, the key was lost with the store's data.
        self._missing_checks += 1
        if self._missing_checks < 2:
            return None
        self._missing_checks = 0
        return f"this node's lease {own.key} vanished from etcd without a deletion"

    def _not_ours(self, own: Lease, stored: Lease | None) -> str | None:
        """Why the record under our key is not the lease we hold, if it is not (a store that
        was wiped and written again, or restored, without its revision going back)."""
        if stored is None:
            return f"this node's lease {own.key} holds a value that is not a lease"
        theirs = (stored.attrs.public_ip, stored.attrs.public_ipv6)
        if theirs != (own.attrs.public_ip, own.attrs.public_ipv6):
            return (f"this node's lease {own.key} now names another node "
                    f"({theirs[0] or theirs[1]})")
        # A renewal in progress rebinds the key before we learn the new etcd lease.
        if stored.etcd_lease_id != own.etcd_lease_id and not self._own_lock.locked():
            return (f"this node's lease {own.key} is bound to etcd lease "
                    f"{stored.etcd_lease_id:x}, not to ours ({own.etcd_lease_id:x})")
        return None

    async def _resync(self, max_backoff: float, reason: str | None = None
                      ) -> tuple[Snapshot, int]:
        """List every lease (retrying while etcd is unavailable); if the store was reset,
        recover first. Raises StoreError when retrying cannot help."""
        retries = RetryLog(log, "listing the leases in etcd")
        backoff = Backoff(0.1, max_backoff, clock=self.clock)
        while True:
            try:
                leases, revision = await self.list_leases()
                reason = reason or self.client.take_reset()
                own = self._own
                if reason is None and own is not None and not self._own_deleted:
                    stored = next((x for x in leases if x.key == own.key), None)
                    reason = self._not_ours(own, stored) if stored is not None else (
                        f"this node's lease {own.key} is missing from etcd")
                if reason is not None:
                    leases, revision = await self._recover(reason, leases)
                    reason = None
                retries.succeeded()
                self.status.relists += 1
                return Snapshot(leases), revision
            except StoreUnavailable as err:
                retries.failed(err, backoff.delay)
                await backoff.wait()

    async def _recover(self, reason: str, listed: list[Lease]) -> tuple[list[Lease], int]:
        """Put our lease back after a reset and list again. Remote leases known before the
        reset but not listed now are kept for ``reset_grace`` seconds, so that peers which are
        re-creating their own leases keep their routes meanwhile."""
        own = self._own
        if not self.status.reason.startswith("recovering"):
            log.error("etcd was wiped or restored from an older backup: %s. Relisting the "
                      "leases and re-creating this node's lease %s; not ready until done",
                      reason, own.key if own else "(none)")
        self.status.set(False, f"recovering from an etcd reset: {reason}")
        if own is not None:
            async with self._own_lock:
                self._own = await self._recreate_own(own, listed, reason)
                self._own_replaced.set()
        leases, revision = await self.list_leases()
        fresh = {lease.key for lease in leases}
        kept = [lease for key, lease in self._known.items()
                if key not in fresh and not any(_overlap(lease, x) for x in leases)]
        log.warning("Recovered from the etcd reset: lease %s is back in etcd; %d remote "
                    "lease(s) listed, %d not yet back kept for %gs", own.key if own else "-",
                    len(fresh) - (own is not None), len(kept), self.reset_grace)
        return leases + kept, revision

    async def _recreate_own(self, own: Lease, listed: list[Lease], reason: str) -> Lease:
        """Our lease with the same subnet and attributes, created if absent with a fresh etcd
        lease; LeaseTaken when another node holds the subnet now."""
        key, value = self.lease_key(own.key), own.attrs.to_json().encode()
        for lease in listed:
            if lease.key != own.key and _overlap(lease, own):
                raise self._taken_error(own, lease, reason)
        kv, _ = await self.client.get(key)
        if kv is not None:
            holder = self._decode(kv)
            if holder is None or holder.attrs.public_ip != own.attrs.public_ip \
                    or holder.attrs.public_ipv6 != own.attrs.public_ipv6:
                raise self._taken_error(own, holder, reason)
            # Restored with our key: make it ours again (value, and an etcd lease we renew).
            mine = await self._put(own.subnet, own.ipv6_subnet, own.attrs,
                                   reservation=holder.is_reservation)
            if kv.lease:
                await self._revoke_quietly(kv.lease)  # holds no key any more
            return mine
        lease_id, ttl = await self._grant()
        try:
            created, _, _ = await self.client.create(key, value, lease_id)
        except BaseException:
            await self._revoke_quietly(lease_id)
            raise
        if not created:
            await self._revoke_quietly(lease_id)
            kv, _ = await self.client.get(key)
            raise self._taken_error(own, self._decode(kv) if kv else None, reason)
        return own.replace(expiration=self.clock.time() + ttl, etcd_lease_id=lease_id)

    def _taken_error(self, own: Lease, holder: Lease | None, reason: str) -> LeaseTaken:
        who = (f"{holder.key} of the node at {holder.attrs.public_ip or holder.attrs.public_ipv6}"
               if holder is not None else "a record that is not this node's")
        return LeaseTaken(
            f"etcd was wiped or restored ({reason}) and this node's subnet {own.key} is now "
            f"held by {who}; this node must not keep using it: restart flanneld to acquire a "
            "new subnet")

    async def public_ip_overrides(self) -> tuple[None, None]:
        return None, None

    async def close(self) -> None:
        await self.client.close()

    async def keep_lease(self, lease: Lease) -> NoReturn:
        """Renew our lease ``renew_margin`` seconds before each expiry, forever; after a reset
        recovery, the re-created lease is the one renewed (``lease`` shows the latest). A
        renewal failure is retried every ``renew_retry`` seconds, as upstream. Raises
        OwnLeaseRevoked rather than re-create a key the watch saw deleted."""
        if self._own is None or not self._own.same_subnet(lease):
            self._own = lease
        while True:
            current = self._own
            self._own_replaced.clear()
            if current.expiration is None:  # a reservation: nothing to renew
                await self._own_replaced.wait()
                continue
            delay = max(0.0, current.expiration - self.renew_margin - self.clock.time())
            if await self.clock.wait(self._own_replaced, delay):
                continue  # re-created after a reset: wait for its own expiry
            if self._own_deleted:
                raise OwnLeaseRevoked(f"this node's lease {current.key} was deleted from etcd")
            try:
                async with self._own_lock:
                    if self._own is not current:
                        continue
                    lease = await self.renew_lease(current)
            except (StoreError, StoreUnavailable) as err:
                self.status.renewal_failures += 1
                log.error("Error renewing lease (trying again in %s): %s",
                          _seconds_text(self.renew_retry), err)
                await self.clock.sleep(self.renew_retry)
                continue
            self.status.renewals += 1
            log.info("Lease renewed, new expiration: %s",
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease.expiration)))


def _seconds_text(seconds: float) -> str:
    return "1 min" if seconds == 60 else f"{seconds:g} s"



def make_etcd_manager(settings: EtcdSettings) -> EtcdSubnetManager:
    """The etcd subnet manager of the ``--etcd-*`` flags; EtcdOptionError names a bad one."""
    options = EtcdOptions(
        endpoints=parse_endpoints(settings.endpoints),
        cafile=settings.cafile, certfile=settings.certfile, keyfile=settings.keyfile,
        username=settings.username, password=settings.password,
    )
    client = EtcdClient(options)
    pair = bool(settings.certfile and settings.keyfile)
    if not any(e.uses_tls(pair) for e in options.endpoints):
        log.warning("etcd TLS is off: use https:// etcd endpoints with --etcd-cafile (and "
                    "--etcd-certfile, --etcd-keyfile if etcd wants client certificates), "
                    "or a unix:// socket only this host can reach")
    previous = read_env(settings.previous_subnet_file)
    return EtcdSubnetManager(
        EtcdKV(client), settings.prefix, lease_ttl=settings.lease_ttl,
        renew_margin=settings.renew_margin,
        previous=PreviousSubnets(single_cidr(previous, "FLANNEL_SUBNET", 4),
                                 single_cidr(previous, "FLANNEL_IPV6_SUBNET", 6)))


@dataclass(frozen=True)
class _Listing:
    """The records under the subnets prefix at ``revision``, where the last write was the
    creation of ``own`` (the last record)."""

    kvs: list[KeyValue]
    revision: int
    own: Lease


def _may_name(kvs: list[KeyValue], attrs: LeaseAttrs) -> list[KeyValue]:
    """The records that may hold our public IP, for reuse by public IP without decoding every
    lease (5000 of them cost ~0.15 s): a value holds an IPv4 address as the exact text
    ``"a.b.c.d"`` (the only spelling the decoder accepts) unless JSON escapes spell it, so
    values with a backslash are kept too. An IPv6 address has many spellings: all are kept."""
    if attrs.public_ip is None:
        return kvs
    needle = f'"{attrs.public_ip}"'.encode()
    return [kv for kv in kvs if needle in kv.value or b"\\" in kv.value]


def _overlap(a: Lease, b: Lease) -> bool:
    return bool((a.subnet and b.subnet and a.subnet.overlaps(b.subnet))
                or (a.ipv6_subnet and b.ipv6_subnet and a.ipv6_subnet.overlaps(b.ipv6_subnet)))
