"""The etcd client reads etcd's JSON gateway: answers are bounded whatever an endpoint sends,
an endpoint that is not etcd's gateway is named as such, and etcd's refusal of certificates
with a Common Name (when its authentication is on) says what to change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from flannel.clients import etcd as etcdclient
from flannel.clients.etcd import (
    EtcdClient,
    EtcdError,
    EtcdOptions,
    EtcdUnavailable,
    parse_endpoints,
)
from flannel_lab.etcd import EtcdServer
from tests.support.proxy import CuttableProxy
from tests.support.tls import make_client_without_cn, make_tls_files

LIMIT = etcdclient.ANSWER.max_bytes


class RawEndpoint:
    """A loopback server that answers every request with the bytes ``answer`` yields: an
    endpoint broken or hostile in ways no real etcd can be made to be. It counts what it
    managed to write before the client hung up."""

    def __init__(self, answer: Callable[[], AsyncIterator[bytes]]) -> None:
        self.answer = answer
        self.written = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline() not in (b"\r\n", b""):
                pass
            async for data in self.answer():
                writer.write(data)
                await writer.drain()
                self.written += len(data)
        except OSError:
            pass
        finally:
            writer.close()


async def endless_chunks() -> AsyncIterator[bytes]:
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"x" * 65536
    while True:
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk)


async def test_an_endless_answer_is_cut_at_the_limit():
    endpoint = RawEndpoint(endless_chunks)
    async with endpoint as url:
        client = EtcdClient(EtcdOptions(parse_endpoints(url), timeout=20))
        try:
            with pytest.raises(EtcdUnavailable, match=f"larger than the limit of {LIMIT} bytes"):
                await client.get(b"/net/config")
        finally:
            await client.close()
    # Read until the limit, then the connection is dropped (socket buffers aside).
    assert endpoint.written < 8 * LIMIT


async def test_an_announced_huge_answer_is_refused_before_reading_it():
    async def huge() -> AsyncIterator[bytes]:
        yield b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n{"
        await asyncio.sleep(30)

    async with RawEndpoint(huge) as url:
        client = EtcdClient(EtcdOptions(parse_endpoints(url), timeout=20))
        try:
            async with asyncio.timeout(10):
                with pytest.raises(EtcdUnavailable, match="1000000000000 bytes is larger than"):
                    await client.get(b"/net/config")
        finally:
            await client.close()


async def test_an_endless_watch_message_is_cut_at_the_limit():
    async def endless_line() -> AsyncIterator[bytes]:
        created = b'{"result":{"header":{"revision":"5"},"created":true}}\n'
        yield (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%s\r\n" % (len(created), created))
        chunk = b'{"result":' + b" " * 65526
        while True:
            yield b"%x\r\n%s\r\n" % (len(chunk), chunk)

    endpoint = RawEndpoint(endless_line)
    async with endpoint as url:
        client = EtcdClient(EtcdOptions(parse_endpoints(url), timeout=20))
        batches = []
        try:
            with pytest.raises(EtcdUnavailable, match=(
                    f"longer than the limit of {etcdclient.WATCH_MESSAGE.max_bytes} bytes")):
                async for batch in client.watch(b"/net/subnets/", 6):
                    batches.append(batch)
        finally:
            await client.close()
    assert [b.created for b in batches] == [True]
    assert endpoint.written < 8 * LIMIT


async def test_a_server_that_is_not_etcds_gateway_is_named():
    async def not_found() -> AsyncIterator[bytes]:
        yield (b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 19\r\n"
               b"\r\n404 page not found\n")

    async with RawEndpoint(not_found) as url:
        client = EtcdClient(EtcdOptions(parse_endpoints(url), timeout=5))
        try:
            with pytest.raises(EtcdUnavailable) as failure:
                await client.get(b"/net/config")
        finally:
            await client.close()
    assert str(failure.value) == (
        f"no etcd endpoint answered (last error: {url}: /v3/kv/range answered HTTP 404 with "
        "no etcd JSON; is this etcd 3.4 or later with its gRPC gateway enabled?)")


@pytest.mark.etcd
async def test_a_certificate_with_a_common_name_on_an_etcd_with_auth_names_the_fix(tmp_path):
    """etcd's gateway refuses such a client outright when authentication is on (the name
    would be taken for the gateway's own user), even one that also gives a password; a
    certificate without a CN and a password, as the message says, are accepted."""
    tls = make_tls_files(tmp_path / "tls")
    nocn_cert, nocn_key = make_client_without_cn(tls, tmp_path / "tls")
    with EtcdServer(tmp_path / "etcd", tls=tls) as server:
        server.ctl("user", "add", "root", "--new-user-password=s3cret")
        server.ctl("auth", "enable")
        client = EtcdClient(EtcdOptions(
            parse_endpoints(server.endpoint), cafile=str(tls.ca), certfile=str(tls.client_cert),
            keyfile=str(tls.client_key), username="root", password="s3cret", timeout=5))
        try:
            with pytest.raises(EtcdError) as failure:
                await client.get(b"/net/config")
        finally:
            await client.close()
        advised = EtcdClient(EtcdOptions(
            parse_endpoints(server.endpoint), cafile=str(tls.ca), certfile=str(nocn_cert),
            keyfile=str(nocn_key), username="root", password="s3cret", timeout=5))
        try:
            await advised.put(b"/net/config", b"{}")
            assert (await advised.get(b"/net/config"))[0].value == b"{}"
        finally:
            await advised.close()
    assert str(failure.value) == (
        "etcd has authentication enabled and refuses client certificates with a Common Name "
        "on its JSON gateway, the API flanneld speaks: give --etcd-certfile a certificate "
        "without a CN (subjectAltName only) and authenticate with --etcd-username and "
        "--etcd-password")


async def test_a_watch_on_an_etcd_that_stopped_answering_moves_on(etcd):
    """A paused etcd keeps its connections open (its kernel still answers TCP keepalives):
    a call that finds it silent leaves the endpoint and ends the watch streams on it, as
    closing a gRPC channel did, so the watch resumes elsewhere instead of waiting."""
    proxy = CuttableProxy(etcd.client_port)
    await proxy.start()
    client = EtcdClient(EtcdOptions(parse_endpoints(proxy.endpoint), timeout=1))
    try:
        stream = client.watch(b"/paused/", 1)
        assert (await anext(stream)).created
        proxy.pause()
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered"):
            await client.get(b"/paused/key")
        async with asyncio.timeout(5):
            with pytest.raises(EtcdUnavailable, match=(
                    f"watch stream broken: {proxy.endpoint} stopped answering other calls")):
                async for _batch in stream:
                    pass
    finally:
        proxy.resume()
        await proxy.cut()
        await client.close()
