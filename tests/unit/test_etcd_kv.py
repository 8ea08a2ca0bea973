"""The etcd client knows no store: its failures are its own, and the etcd store
(``flannel/subnet/etcd/kv.py``) translates them into the store's contract, the retryable
kind and the fatal kind, with the client's message unchanged.

The client here is the real one; only its network exchange is replaced by etcd's answer
(what etcd's JSON gateway writes for a refused call), or a loopback port nothing listens
on. Real etcd behind the same translation: tests/integration/test_etcd_client.py."""

from __future__ import annotations

import json

import pytest

from flannel.clients.etcd import (
    Code,
    EtcdClient,
    EtcdError,
    EtcdOptions,
    EtcdTooLarge,
    EtcdUnavailable,
    parse_endpoints,
)
from flannel.clients.http import Budget
from flannel.subnet.errors import StoreError, StoreUnavailable
from flannel.subnet.etcd.kv import AnswerTooLarge, EtcdKV, Refused
from flannel_lab.etcd import free_port


class _Answering(EtcdClient):
    """A client whose every request gets ``status`` and ``body`` back."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(EtcdOptions(parse_endpoints("http://127.0.0.1:1"), timeout=1))
        self.status, self.body = status, body

    async def _post(self, index: int, path: str, request: dict, token: str | None,
                    require_leader: bool, budget: Budget) -> tuple[int, bytes]:
        return self.status, self.body


def refusal(code: Code, message: str) -> bytes:
    return json.dumps({"error": message, "code": int(code), "message": message}).encode()


async def test_no_answer_is_the_client_s_unavailable_and_the_store_s_retryable_kind():
    client = EtcdClient(EtcdOptions(parse_endpoints(f"http://127.0.0.1:{free_port()}"),
                                    timeout=2))
    try:
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered") as raw:
            await client.get(b"/net/config")
        assert not isinstance(raw.value, (StoreUnavailable, StoreError))
        with pytest.raises(StoreUnavailable) as seen:
            await EtcdKV(client).get(b"/net/config")
        assert str(seen.value) == str(raw.value)
        assert not isinstance(seen.value, EtcdUnavailable)
    finally:
        await client.close()


async def test_a_refusal_is_fatal_to_the_store_and_keeps_etcd_s_code():
    client = _Answering(400, refusal(Code.INVALID_ARGUMENT, "etcdserver: key is not provided"))
    with pytest.raises(EtcdError) as raw:
        await client.put(b"", b"x")
    assert not isinstance(raw.value, (StoreUnavailable, StoreError))
    with pytest.raises(Refused) as seen:
        await EtcdKV(client).put(b"", b"x")
    assert isinstance(seen.value, StoreError)
    assert (str(seen.value), seen.value.code) == (str(raw.value), Code.INVALID_ARGUMENT)


async def test_an_answer_over_its_budget_is_retried_by_the_store():
    client = _Answering(200, b"[" + b"[]," * 400_000 + b"[]]")
    with pytest.raises(EtcdTooLarge) as raw:
        await client.get(b"/net/config")
    with pytest.raises(AnswerTooLarge) as seen:
        await EtcdKV(client).get(b"/net/config")
    assert isinstance(seen.value, StoreUnavailable)
    assert str(seen.value) == str(raw.value)
