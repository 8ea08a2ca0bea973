"""An in-memory etcd v3 for the fast lane: the store behind the etcd subnet manager's seam
(``flannel.subnet.etcd.kv.KV``), with no process, socket or real time.

What it models, as etcd v3 does it (the same behavioural tests run against it and against a
real etcd: tests/unit/test_etcd_behaviour.py):

- one revision counter for the whole store (1 when empty); every put, every deletion, and
  every transaction that writes, whatever it writes, takes the next one; a record keeps the
  revision of its creation and of its last change;
- a listing is at one revision and in key order; ``keys_only`` leaves the values empty;
- a create-if-absent transaction compares the key's version with 0 and, when it fails,
  lists the prefix at the transaction's revision (which does not move);
- leases: granted with a TTL (at least ``MIN_TTL``, refused over etcd's maximum with
  OUT_OF_RANGE), a put bound to a lease that does not exist refused with NOT_FOUND; a
  lease's time left counts down on the injected clock (rounded up, -1 once gone); a lease
  that expires or is revoked deletes every key bound to it in one revision;
- watch: from any revision still in the history, the past events first, then the live ones,
  the events of one revision in one batch; first a ``created`` batch; a start revision below
  the compaction point fails with ``Compacted`` after it; ``notify_progress`` sends a
  progress batch with the store's revision to every stream, as etcd's progress
  notifications do;
- the answers' headers: each client (``FakeKV``) tracks the highest revision and the cluster
  ID it has seen, and notes a reset as the real client does (``take_reset``).

Faults a test can make: ``outage`` (every call and stream fails with ``StoreUnavailable``
until it ends), ``break_watches``, ``compact``, ``wipe`` (a new, empty cluster: new ID,
revision back to 1), ``snapshot``/``restore`` (an older backup: same ID, the revision goes
back). Not modelled: the wire, TLS, authentication, paging and answer budgets (the real
client's business: tests/integration/), a watch's own back-pressure.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from flannel.clients.etcd import Code, KeyValue, WatchBatch, WatchEvent, prefix_range_end
from flannel.subnet.errors import StoreUnavailable
from flannel.subnet.etcd.kv import Compacted, Refused
from flannel.timing.clock import Clock

#: etcd's smallest TTL with its default election timeout (1 s) and heartbeat (100 ms):
#: 1.5 election timeouts, rounded up to whole seconds; a shorter one is raised to it.
MIN_TTL = 2
#: etcd's MaxLeaseTTL.
MAX_TTL = 9_000_000_000


@dataclass
class _Lease:
    ttl: int
    expires: float
    keys: set[bytes] = field(default_factory=set)


@dataclass
class _State:
    """What a backup holds: the records, the leases, the history, the revisions."""

    revision: int = 1
    compacted: int = 0
    records: dict[bytes, KeyValue] = field(default_factory=dict)
    leases: dict[int, _Lease] = field(default_factory=dict)
    #: Every event after the compaction point, in revision order.
    history: list[WatchEvent] = field(default_factory=list)


class FakeEtcd:
    """One etcd cluster in memory. Use as ``async with FakeEtcd(clock) as etcd`` (leases
    expire on their own while it is open) and connect clients with ``etcd.client()``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._cluster_ids = itertools.count(0x1000)
        self.cluster_id = next(self._cluster_ids)
        self._state = _State()
        self._lease_ids = itertools.count(0x694D7A1C00000001)
        self._streams: set[_Stream] = set()
        self._changed = asyncio.Event()
        self._expirer: asyncio.Task[None] | None = None
        self.down: str | None = None

    async def __aenter__(self) -> FakeEtcd:
        self._expirer = asyncio.create_task(self._expire_leases(), name="fake etcd leases")
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._expirer is not None:
            self._expirer.cancel()
            await asyncio.gather(self._expirer, return_exceptions=True)

    def client(self) -> FakeKV:
        return FakeKV(self)

    # -- what a test does to the store ----------------------------------------------------

    @property
    def revision(self) -> int:
        return self._state.revision

    def outage(self, why: str | None = "etcd is down") -> None:
        """Every call and watch fails as unavailable until ``outage(None)``."""
        self.down = why
        if why is not None:
            self.break_watches(why)

    def break_watches(self, why: str = "the watch stream broke") -> None:
        for stream in list(self._streams):
            stream.fail(StoreUnavailable(why))

    def compact(self, revision: int | None = None) -> None:
        """Forget the history before ``revision`` (the current one by default)."""
        state = self._state
        revision = state.revision if revision is None else revision
        if revision <= state.compacted or revision > state.revision:
            raise Refused(f"etcdserver: cannot compact at {revision}", Code.OUT_OF_RANGE)
        state.compacted = revision
        state.history = [e for e in state.history if e.kv.mod_revision >= revision]

    def notify_progress(self) -> None:
        """A progress notification on every stream: nothing happened up to the revision."""
        for stream in list(self._streams):
            stream.push(WatchBatch([], self._state.revision, progress=True))

    def wipe(self) -> None:
        """A new, empty cluster in place of this one (its data directory lost)."""
        self.cluster_id = next(self._cluster_ids)
        self._state = _State()
        self.break_watches("etcd restarted")
        self._changed.set()

    def snapshot(self) -> _State:
        return copy.deepcopy(self._state)

    def restore(self, backup: _State) -> None:
        """This cluster restored from ``backup`` (its revision goes back)."""
        self._state = copy.deepcopy(backup)
        self.break_watches("etcd restarted")
        self._changed.set()

    def leases(self) -> set[int]:
        return set(self._state.leases)

    # -- etcd's side of the calls ------------------------------------------------------------

    def _check_up(self) -> None:
        if self.down is not None:
            raise StoreUnavailable(f"no etcd endpoint answered (last error: {self.down})")

    def _commit(self, events: list[WatchEvent]) -> None:
        """Write ``events`` (all of one new revision) and tell the streams."""
        state = self._state
        for event in events:
            if event.deleted:
                old = state.records.pop(event.kv.key)
                if old.lease in state.leases:
                    state.leases[old.lease].keys.discard(old.key)
            else:
                old = state.records.get(event.kv.key)
                if old is not None and old.lease in state.leases:
                    state.leases[old.lease].keys.discard(old.key)
                state.records[event.kv.key] = event.kv
                if event.kv.lease:
                    state.leases[event.kv.lease].keys.add(event.kv.key)
        state.history += events
        for stream in list(self._streams):
            stream.offer(events)

    def _next(self) -> int:
        self._state.revision += 1
        return self._state.revision

    def _put_event(self, key: bytes, value: bytes, lease: int, revision: int) -> WatchEvent:
        old = self._state.records.get(key)
        created = old.create_revision if old is not None else revision
        return WatchEvent(False, KeyValue(key, value, lease, created, revision))

    def range(self, prefix: bytes, *, keys_only: bool = False,
              single: bool = False) -> list[KeyValue]:
        records = self._state.records
        if single:
            found = records.get(prefix)
            return [found] if found is not None else []
        end = prefix_range_end(prefix)
        kvs = [records[k] for k in sorted(records) if prefix <= k < end]
        return [replace(kv, value=b"") for kv in kvs] if keys_only else kvs

    def put(self, key: bytes, value: bytes, lease: int) -> int:
        if lease and lease not in self._state.leases:
            raise Refused("etcd Put failed: NOT_FOUND: etcdserver: requested lease not found",
                          Code.NOT_FOUND)
        revision = self._next()
        self._commit([self._put_event(key, value, lease, revision)])
        return revision

    def delete(self, key: bytes) -> int:
        if key not in self._state.records:
            return 0
        revision = self._next()
        self._commit([WatchEvent(True, KeyValue(key, b"", 0, 0, revision))])
        return 1

    def grant(self, ttl: int) -> tuple[int, int]:
        if ttl > MAX_TTL:
            raise Refused("etcd LeaseGrant failed: OUT_OF_RANGE: etcdserver: too large lease "
                          "TTL", Code.OUT_OF_RANGE)
        ttl = max(ttl, MIN_TTL)
        lease_id = next(self._lease_ids)
        self._state.leases[lease_id] = _Lease(ttl, self.clock.monotonic() + ttl)
        self._changed.set()
        return lease_id, ttl

    def revoke(self, lease_id: int) -> None:
        lease = self._state.leases.pop(lease_id, None)
        if lease is None or not lease.keys:
            return
        revision = self._next()
        self._commit([WatchEvent(True, KeyValue(key, b"", 0, 0, revision))
                      for key in sorted(lease.keys)])

    def time_to_live(self, lease_id: int) -> int:
        lease = self._state.leases.get(lease_id)
        if lease is None:
            return -1
        left = lease.expires - self.clock.monotonic()
        return max(0, -int(-left // 1))

    async def _expire_leases(self) -> None:
        while True:
            now = self.clock.monotonic()
            for lease_id, lease in list(self._state.leases.items()):
                if lease.expires <= now:
                    self.revoke(lease_id)
            soonest = min((x.expires for x in self._state.leases.values()), default=None)
            self._changed.clear()
            await self.clock.wait(self._changed, 3600.0 if soonest is None
                                  else max(0.0, soonest - now))

    def watch(self, key: bytes, start_revision: int) -> _Stream:
        stream = _Stream(self, key)
        state = self._state
        stream.push(WatchBatch([], start_revision - 1, created=True))
        if 0 < start_revision < state.compacted:
            stream.fail(Compacted(
                f"etcd compacted the watch's start revision {start_revision} away "
                f"(compacted up to {state.compacted})", state.compacted))
            return stream
        past = [e for e in state.history
                if e.kv.mod_revision >= start_revision and e.kv.key.startswith(key)]
        for _, events in itertools.groupby(past, key=lambda e: e.kv.mod_revision):
            stream.push(WatchBatch(list(events), 0))
        self._streams.add(stream)
        return stream


class _Stream:
    """One watch stream's batches, queued until its reader takes them."""

    def __init__(self, etcd: FakeEtcd, prefix: bytes) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self.queue: asyncio.Queue[WatchBatch | Exception] = asyncio.Queue()

    def push(self, batch: WatchBatch) -> None:
        if batch.events:
            batch = replace(batch, revision=batch.events[-1].kv.mod_revision)
        self.queue.put_nowait(batch)

    def offer(self, events: list[WatchEvent]) -> None:
        mine = [e for e in events if e.kv.key.startswith(self.prefix)]
        if mine:
            self.push(WatchBatch(mine, 0))

    def fail(self, error: Exception) -> None:
        self.etcd._streams.discard(self)
        self.queue.put_nowait(error)

    def close(self) -> None:
        self.etcd._streams.discard(self)


class FakeKV:
    """One client of a ``FakeEtcd``: ``flannel.subnet.etcd.kv.KV``, with the store's errors,
    noting resets from the answers' cluster ID and revision as the real client does."""

    def __init__(self, etcd: FakeEtcd) -> None:
        self.etcd = etcd
        self.revision = 0
        self.cluster_id = 0
        self._reset: str | None = None
        self.calls: list[str] = []

    def _answer(self, floor: int) -> int:
        """Note an answer's header (sent when ``floor`` was the highest revision seen)."""
        etcd = self.etcd
        revision = etcd.revision
        if self.cluster_id and etcd.cluster_id != self.cluster_id:
            self._reset = (f"the etcd cluster ID changed from {self.cluster_id:x} to "
                           f"{etcd.cluster_id:x}")
            self.revision = revision
        elif revision < floor:
            self._reset = f"the etcd revision went back from {floor} to {revision}"
            self.revision = revision
        else:
            self.revision = max(self.revision, revision)
        self.cluster_id = etcd.cluster_id
        return revision

    async def _call(self, name: str) -> int:
        """Enter a call: yields to the loop as a round trip would; the revision floor."""
        self.calls.append(name)
        await asyncio.sleep(0)
        self.etcd._check_up()
        return self.revision

    def take_reset(self) -> str | None:
        reset, self._reset = self._reset, None
        return reset

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        floor = await self._call("get")
        found = self.etcd.range(key, single=True)
        return (found[0] if found else None), self._answer(floor)

    async def get_prefix(self, prefix: bytes, *, keys_only: bool = False
                         ) -> tuple[list[KeyValue], int]:
        floor = await self._call("get_prefix")
        kvs = self.etcd.range(prefix, keys_only=keys_only)
        return kvs, self._answer(floor)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        floor = await self._call("put")
        self.etcd.put(key, value, lease)
        return self._answer(floor)

    async def delete(self, key: bytes) -> int:
        floor = await self._call("delete")
        deleted = self.etcd.delete(key)
        self._answer(floor)
        return deleted

    async def create(self, key: bytes, value: bytes, lease: int = 0, *,
                     else_list: bytes | None = None) -> tuple[bool, list[KeyValue], int]:
        floor = await self._call("create")
        if not self.etcd.range(key, single=True):
            self.etcd.put(key, value, lease)
            return True, [], self._answer(floor)
        listed = [] if else_list is None else self.etcd.range(else_list, keys_only=True)
        return False, listed, self._answer(floor)

    async def grant(self, ttl: int) -> tuple[int, int]:
        floor = await self._call("grant")
        granted = self.etcd.grant(ttl)
        self._answer(floor)
        return granted

    async def revoke(self, lease_id: int) -> None:
        floor = await self._call("revoke")
        self.etcd.revoke(lease_id)
        self._answer(floor)

    async def time_to_live(self, lease_id: int) -> int:
        floor = await self._call("time_to_live")
        left = self.etcd.time_to_live(lease_id)
        self._answer(floor)
        return left

    async def watch(self, key: bytes, start_revision: int) -> AsyncIterator[WatchBatch]:
        await self._call("watch")
        stream = self.etcd.watch(key, start_revision)
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.events:
                    self.revision = max(self.revision, item.revision)
                yield item
        finally:
            stream.close()

    async def close(self) -> None:
        pass

    # -- calls the manager does not make, which tests make as they would on the real client

    async def leases(self) -> set[int]:
        await self._call("leases")
        return self.etcd.leases()

    async def compact(self, revision: int) -> None:
        await self._call("compact")
        self.etcd.compact(revision)
