"""The etcd client as the etcd store uses it: the calls the subnet manager and the operator
commands make, each failure translated into the store's contract (``flannel.subnet.errors``).

Owns the translation, so that the client (``flannel.clients.etcd``) knows no store:
``EtcdUnavailable`` (no endpoint answered, etcd asked to retry, the credentials not
accepted yet) becomes ``StoreUnavailable``; an answer over its budget ``AnswerTooLarge`` and
a compacted revision ``Compacted``, both ``StoreUnavailable`` that the lease watch answers by
relisting; ``EtcdError`` (etcd refused for a reason retrying will not fix) ``Refused``, a
``StoreError`` that keeps etcd's status code. Messages pass through unchanged.
Must not touch: what is read or written (the manager decides), the kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterator

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


class EtcdKV:
    """``EtcdClient``'s calls the store makes, raising the store's errors."""

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
