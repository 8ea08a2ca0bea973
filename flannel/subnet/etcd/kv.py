"""The etcd store's seam: ``KV``, the key-value calls the subnet manager and the operator
commands make (as Go flannel's ``Registry`` is the etcd manager's), and ``EtcdKV``, the real
one, which makes them with the etcd client and translates each failure into the store's
contract (``flannel.subnet.errors``).

``KV`` is etcd v3's model, no more than the manager uses: a listing at one revision, a
create-if-absent transaction that lists the prefix when it fails, puts bound to a lease,
leases granted with a TTL, revoked and asked for their time left, and a watch from a
revision that reports its creation, progress notifications and compaction. The fast lane's
in-memory etcd (``tests/support/fakeetcd.py``) implements it too, and the behavioural tests
run against both (``tests/unit/test_etcd_behaviour.py``).

``EtcdKV`` owns the translation, so that the client (``flannel.clients.etcd``) knows no store:
``EtcdUnavailable`` (no endpoint answered, etcd asked to retry, the credentials not
accepted yet) becomes ``StoreUnavailable``; an answer over its budget ``AnswerTooLarge`` and
a compacted revision ``Compacted``, both ``StoreUnavailable`` that the lease watch answers by
relisting; ``EtcdError`` (etcd refused for a reason retrying will not fix) ``Refused``, a
``StoreError`` that keeps etcd's status code. Messages pass through unchanged.
Must not touch: what is read or written (the manager decides), the kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Protocol

from flannel.clients.etcd import (
    Code,
    EtcdClient,
    EtcdCompacted,
    EtcdError,
    EtcdTooLarge,
    EtcdUnavailable,
    KeyValue,
    WatchBatch,
)
from flannel.subnet.errors import StoreError, StoreUnavailable


class Refused(StoreError):
    """etcd refused a request for a reason retrying will not fix; the message says what to
    fix, ``code`` is etcd's status."""

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        self.code = code


class AnswerTooLarge(StoreUnavailable):
    """An answer (or a watch message) was larger than its budget: it was not decoded."""


class Compacted(StoreUnavailable):
    """A watch asked for a revision that etcd has compacted away."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """The client's failures inside the block as the store's."""
    try:
        yield
    except EtcdCompacted as err:
        raise Compacted(str(err), err.compact_revision) from None
    except EtcdTooLarge as err:
        raise AnswerTooLarge(str(err)) from None
    except EtcdUnavailable as err:
        raise StoreUnavailable(str(err)) from None
    except EtcdError as err:
        raise Refused(str(err), err.code) from None


class KV(Protocol):
    """The calls the etcd store makes. Each raises ``StoreUnavailable`` when retrying later
    may help (``Compacted``, ``AnswerTooLarge`` included) and ``StoreError`` (``Refused``)
    when it will not."""

    @property
    def revision(self) -> int:
        """The highest revision seen in an answer or a watch event."""

    def take_reset(self) -> str | None:
        """What showed that the store was wiped or restored since the last call (its cluster
        ID changed, or a linearizable answer went below the highest revision seen)."""

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        """The record under ``key`` and the store's revision."""

    async def get_prefix(self, prefix: bytes, *, keys_only: bool = False
                         ) -> tuple[list[KeyValue], int]:
        """Every record under ``prefix`` in key order, all at one revision, and that
        revision (values left empty with ``keys_only``)."""

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write ``key`` (bound to etcd lease ``lease`` unless 0); the revision of the write.
        Refused (NOT_FOUND) when the lease does not exist."""

    async def delete(self, key: bytes) -> int:
        """Delete ``key``; how many records were deleted (0 or 1)."""

    async def create(self, key: bytes, value: bytes, lease: int = 0, *,
                     else_list: bytes | None = None) -> tuple[bool, list[KeyValue], int]:
        """Put ``key`` only if it does not exist (one transaction comparing its version
        with 0): whether it was created, with ``else_list`` when it was not every key under
        that prefix (names only) at the transaction's revision, and that revision."""

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new etcd lease: its ID and the TTL granted. Refused (OUT_OF_RANGE) for a TTL
        over etcd's maximum."""

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease, deleting every key bound to it; one that is gone is fine."""

    async def time_to_live(self, lease_id: int) -> int:
        """Seconds left on a lease; -1 when it does not exist."""

    def watch(self, key: bytes, start_revision: int) -> AsyncIterator[WatchBatch]:
        """The changes under the prefix ``key`` from ``start_revision`` on: first a batch
        ``created`` (no events), then batches of events in revision order and ``progress``
        batches (no events, how far the stream has read). Raises ``Compacted`` when
        ``start_revision`` is compacted away, ``StoreUnavailable`` when the stream breaks;
        it never ends otherwise."""

    async def close(self) -> None:
        """Release the connections."""


class EtcdKV:
    """``KV`` over the etcd client: its calls, raising the store's errors."""

    def __init__(self, client: EtcdClient) -> None:
        self.etcd = client

    @property
    def revision(self) -> int:
        """The highest revision the client has seen."""
        return self.etcd.revision

    def take_reset(self) -> str | None:
        """What showed that the store was wiped or restored since the last call, if anything."""
        return self.etcd.take_reset()

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        with translated():
            return await self.etcd.get(key)

    async def get_prefix(self, prefix: bytes, *, keys_only: bool = False
                         ) -> tuple[list[KeyValue], int]:
        with translated():
            return await self.etcd.get_prefix(prefix, keys_only=keys_only)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        with translated():
            return await self.etcd.put(key, value, lease)

    async def delete(self, key: bytes) -> int:
        with translated():
            return await self.etcd.delete(key)

    async def create(self, key: bytes, value: bytes, lease: int = 0, *,
                     else_list: bytes | None = None) -> tuple[bool, list[KeyValue], int]:
        with translated():
            return await self.etcd.create(key, value, lease, else_list=else_list)

    async def grant(self, ttl: int) -> tuple[int, int]:
        with translated():
            return await self.etcd.grant(ttl)

    async def revoke(self, lease_id: int) -> None:
        with translated():
            await self.etcd.revoke(lease_id)

    async def time_to_live(self, lease_id: int) -> int:
        with translated():
            return await self.etcd.time_to_live(lease_id)

    async def watch(self, key: bytes, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        async with contextlib.aclosing(self.etcd.watch(key, start_revision)) as stream:
            with translated():
                async for batch in stream:
                    yield batch

    async def close(self) -> None:
        await self.etcd.close()
