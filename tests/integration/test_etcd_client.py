"""The etcd client against real etcd servers: TLS, password auth with token expiry, failover."""

from __future__ import annotations

import asyncio
import logging

import pytest

from flannel.lab.etcd import EtcdServer, free_port
from flannel.subnet.etcdclient import (
    EtcdClient,
    EtcdError,
    EtcdOptionError,
    EtcdOptions,
    EtcdUnavailable,
    parse_endpoints,
)
from tests.support.tls import make_tls_files


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


async def test_tls_with_client_certificates(tmp_path, tls_files):
    with EtcdServer(tmp_path / "etcd", tls=tls_files) as server:
        client = EtcdClient(EtcdOptions(
            parse_endpoints(server.endpoint), cafile=str(tls_files.ca),
            certfile=str(tls_files.client_cert), keyfile=str(tls_files.client_key)))
        try:
            await client.put(b"/tls/key", b"value")
            kv, _ = await client.get(b"/tls/key")
            assert kv.value == b"value"
        finally:
            await client.close()
        # Without a client certificate the server refuses us.
        anonymous = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                           cafile=str(tls_files.ca), timeout=2))
        try:
            with pytest.raises(EtcdError):
                await anonymous.get(b"/tls/key")
        finally:
            await anonymous.close()


def test_tls_needs_both_cert_and_key(tls_files):
    with pytest.raises(EtcdOptionError, match="--etcd-certfile and --etcd-keyfile"):
        EtcdClient(EtcdOptions(parse_endpoints("https://127.0.0.1:2379"),
                               certfile=str(tls_files.client_cert)))
    with pytest.raises(EtcdOptionError, match="--etcd-cafile: cannot read"):
        EtcdClient(EtcdOptions(parse_endpoints("https://127.0.0.1:2379"),
                               cafile="/nonexistent/ca.pem"))


async def test_password_auth_and_reauthentication_after_token_expiry(tmp_path, caplog):
    with EtcdServer(tmp_path / "etcd", auth_token_ttl=1) as server:
        server.ctl("user", "add", "root", "--new-user-password=s3cret")
        server.ctl("auth", "enable")
        client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                        username="root", password="s3cret"))
        try:
            await client.put(b"/auth/key", b"v1")
            caplog.set_level(logging.INFO, logger="flannel.subnet.etcdclient")
            # Simple tokens expire --auth-token-ttl after their last use; the next request
            # then fails with an invalid token and must re-authenticate transparently.
            await asyncio.sleep(3)
            await client.put(b"/auth/key", b"v2")
            assert "re-authenticating" in caplog.text
            kv, _ = await client.get(b"/auth/key")
            assert kv.value == b"v2"
        finally:
            await client.close()
        wrong = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                       username="root", password="wrong"))
        try:
            with pytest.raises(EtcdError, match="--etcd-password"):
                await wrong.get(b"/auth/key")
        finally:
            await wrong.close()


async def test_failover_to_the_next_endpoint(etcd):
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(EtcdOptions(parse_endpoints(f"{dead},{etcd.endpoint}"), timeout=2))
    try:
        await client.put(b"/failover/key", b"ok")
        kv, _ = await client.get(b"/failover/key")
        assert kv.value == b"ok"
        assert str(client.endpoint) == etcd.endpoint
    finally:
        await client.close()


async def test_all_endpoints_down_is_unavailable():
    client = EtcdClient(EtcdOptions(parse_endpoints(
        f"http://127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}"), timeout=2))
    try:
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered"):
            await client.get(b"/x")
    finally:
        await client.close()


@pytest.mark.parametrize("text", ["", "ftp://x:1", "http://:2379", "http://h:99999"])
def test_bad_endpoints_name_the_flag(text):
    with pytest.raises(EtcdOptionError, match="--etcd-endpoints"):
        parse_endpoints(text)
