"""The etcd client against real etcd servers: TLS, password auth with token expiry, failover."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import pytest

from flannel.clients.etcd import (
    EtcdAuthFailed,
    EtcdClient,
    EtcdError,
    EtcdOptionError,
    EtcdOptions,
    EtcdUnavailable,
    parse_endpoints,
)
from flannel.subnet.errors import StoreError, StoreUnavailable
from flannel.subnet.etcd.kv import EtcdKV, Refused
from flannel_lab.etcd import EtcdServer, free_port
from tests.support.fifos import outcome_of_reading
from tests.support.tls import make_tls_files
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.etcd  # most tests start an etcd of their own


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
        # Without a client certificate the server refuses the handshake: it may be fixed
        # on the server, so it is retried (unavailable), not fatal.
        anonymous = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                           cafile=str(tls_files.ca), timeout=2))
        try:
            with pytest.raises(EtcdUnavailable):
                await anonymous.get(b"/tls/key")
        finally:
            await anonymous.close()


async def test_key_without_cert_is_ignored_with_a_warning_as_go(tmp_path, tls_files, caplog):
    """Go flannel sends no client certificate unless both files are given, and goes on."""
    with EtcdServer(tmp_path / "etcd") as server:
        for half in ({"keyfile": str(tls_files.client_key)},
                     {"certfile": str(tls_files.client_cert)}):
            caplog.clear()
            client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint), **half))
            try:
                await client.put(b"/half/key", b"v")
                kv, _ = await client.get(b"/half/key")
                assert kv is not None and kv.value == b"v"
            finally:
                await client.close()
            given, missing = (("--etcd-keyfile", "--etcd-certfile") if "keyfile" in half
                              else ("--etcd-certfile", "--etcd-keyfile"))
            assert any(r.levelno == logging.WARNING and given in r.getMessage()
                       and missing in r.getMessage() for r in caplog.records)


async def test_cafile_alone_verifies_an_https_etcd(tmp_path, tls_files):
    """Go reads --etcd-cafile only with a client certificate pair (otherwise https is checked
    against the system's CAs); ours uses it for https endpoints in any case."""
    with EtcdServer(tmp_path / "etcd", tls=tls_files, client_cert_auth=False) as server:
        client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                        cafile=str(tls_files.ca), timeout=2))
        try:
            await client.put(b"/ca-only/key", b"v")
            kv, _ = await client.get(b"/ca-only/key")
            assert kv is not None and kv.value == b"v"
        finally:
            await client.close()


async def test_user_name_without_password_means_no_authentication_as_go(etcd, caplog):
    """Go's etcd client authenticates only with both a user name and a password; one alone
    is no authentication (an etcd without auth answers), said in a warning."""
    client = EtcdClient(EtcdOptions(parse_endpoints(etcd.endpoint), username="flannel",
                                    timeout=2))
    try:
        await client.put(b"/user-only/key", b"v")
        kv, _ = await client.get(b"/user-only/key")
        assert kv is not None and kv.value == b"v"
    finally:
        await client.close()
    assert ("--etcd-username is given without --etcd-password: no password authentication "
            "with etcd; give both to authenticate as a user") in caplog.text


async def test_unix_socket_endpoint(tmp_path):
    """Go's etcd client dials unix://path endpoints; so does ours (plain, no TLS)."""
    with EtcdServer(tmp_path / "etcd", socket_dir=tmp_path) as server:
        assert server.endpoint.startswith(f"unix://{tmp_path}/localhost:")
        client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint), timeout=2))
        try:
            await client.put(b"/unix/key", b"over a socket")
            kv, _ = await client.get(b"/unix/key")
            assert kv is not None and kv.value == b"over a socket"
        finally:
            await client.close()


async def test_unixs_socket_endpoint_with_client_certificates(tmp_path, tls_files):
    """unixs:// always uses TLS; the server name checked is the socket's file name without
    its ``:port`` (as Go's client), so ``localhost:<port>`` verifies against a certificate
    for localhost."""
    with EtcdServer(tmp_path / "etcd", tls=tls_files, socket_dir=tmp_path) as server:
        assert server.endpoint.startswith(f"unixs://{tmp_path}/localhost:")
        client = EtcdClient(EtcdOptions(
            parse_endpoints(server.endpoint), cafile=str(tls_files.ca),
            certfile=str(tls_files.client_cert), keyfile=str(tls_files.client_key), timeout=2))
        try:
            await client.put(b"/unixs/key", b"v")
            kv, _ = await client.get(b"/unixs/key")
            assert kv is not None and kv.value == b"v"
        finally:
            await client.close()


def test_unreadable_cafile_is_named(tls_files):
    with pytest.raises(EtcdOptionError, match="--etcd-cafile: cannot read"):
        EtcdClient(EtcdOptions(parse_endpoints("https://127.0.0.1:2379"),
                               cafile="/nonexistent/ca.pem"))


def test_a_fifo_as_a_tls_file_is_refused_at_once(tmp_path):
    """Opening a FIFO for reading waits for a writer: flanneld's start would hang."""
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo, 0o600)

    def attempt() -> str:
        try:
            EtcdClient(EtcdOptions(parse_endpoints("https://127.0.0.1:2379"), cafile=str(fifo)))
        except EtcdOptionError as err:
            return str(err)
        return "accepted"

    outcome = [outcome_of_reading(fifo, attempt, "--etcd-cafile")]
    assert outcome == [f"--etcd-cafile: cannot read {fifo}: Not a regular file but a FIFO; "
                       "give the path of a PEM file"]


def test_a_ca_file_others_could_replace_is_warned_about(tls_files, tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    ca = shared / "ca.pem"
    ca.write_bytes(tls_files.ca.read_bytes())
    EtcdClient(EtcdOptions(parse_endpoints("https://127.0.0.1:2379"), cafile=str(ca)))
    assert (f"--etcd-cafile {ca} can be replaced by other users: directory {shared} is "
            f"writable by other users (mode 0777): run `chmod go-w {shared}`; whoever "
            "replaces it decides which etcd flanneld trusts") in caplog.text


async def test_password_auth_and_reauthentication_after_token_expiry(tmp_path, caplog):
    with EtcdServer(tmp_path / "etcd", auth_token_ttl=1) as server:
        server.ctl("user", "add", "root", "--new-user-password=s3cret")
        server.ctl("auth", "enable")
        client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                        username="root", password="s3cret"))
        try:
            await client.put(b"/auth/key", b"v1")
            caplog.set_level(logging.INFO, logger="flannel.clients.etcd")
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
            # Every attempt says the same (a failed login used to leave a channel without a
            # token behind, and the next attempt said "user name is empty").
            for _attempt in range(3):
                with pytest.raises(EtcdAuthFailed) as failure:
                    await wrong.get(b"/auth/key")
                assert str(failure.value) == (
                    "etcd authentication as 'root' failed: wrong user name or password; "
                    "check --etcd-username and --etcd-password")
            # The store retries it (it may be fixed on the server), saying the same.
            with pytest.raises(StoreUnavailable) as as_the_store_sees_it:
                await EtcdKV(wrong).get(b"/auth/key")
            assert str(as_the_store_sees_it.value) == str(failure.value)
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


@pytest.mark.parametrize("text", ["", "ftp://x:1", "http://:2379", "http://h:99999",
                                  "unix://", "unixs:", "unix:///" + "s" * 200])
def test_bad_endpoints_name_the_flag(text):
    with pytest.raises(EtcdOptionError, match="--etcd-endpoints"):
        parse_endpoints(text)


async def test_read_only_user_is_refused_with_the_permission_to_grant(tmp_path):
    with EtcdServer(tmp_path / "etcd") as server:
        server.ctl("user", "add", "root", "--new-user-password=s3cret")
        server.ctl("user", "add", "reader", "--new-user-password=r")
        server.ctl("role", "add", "ro")
        server.ctl("role", "grant-permission", "ro", "read", "/net/", "--prefix=true")
        server.ctl("user", "grant-role", "reader", "ro")
        server.ctl("auth", "enable")
        client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint),
                                        username="reader", password="r"))
        try:
            assert (await client.get(b"/net/config"))[0] is None  # reading is allowed
            with pytest.raises(EtcdError) as failure:
                await client.create(b"/net/subnets/10.1.2.0-24", b"{}")
            assert str(failure.value) == (
                "etcd user 'reader' may not write /net/subnets/10.1.2.0-24: grant it "
                "readwrite on the prefix (etcdctl role grant-permission <role> readwrite "
                "/net/subnets/ --prefix=true; etcdctl user grant-role reader <role>)")
            # Fatal to the store, saying the same, with etcd's code.
            with pytest.raises(Refused) as as_the_store_sees_it:
                await EtcdKV(client).create(b"/net/subnets/10.1.2.0-24", b"{}")
            assert str(as_the_store_sees_it.value) == str(failure.value)
            assert isinstance(as_the_store_sees_it.value, StoreError)
            assert as_the_store_sees_it.value.code == failure.value.code
        finally:
            await client.close()


async def test_no_user_name_on_an_etcd_with_auth_names_the_flags(tmp_path):
    with EtcdServer(tmp_path / "etcd") as server:
        server.ctl("user", "add", "root", "--new-user-password=s3cret")
        server.ctl("auth", "enable")
        client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint)))
        try:
            with pytest.raises(EtcdError) as failure:
                await client.get(b"/net/config")
            assert str(failure.value) == (
                "etcd Range failed: INVALID_ARGUMENT: etcdserver: user name is empty; if etcd "
                "has authentication enabled, pass --etcd-username and --etcd-password")
        finally:
            await client.close()


async def test_revoking_a_lease_that_is_gone_is_not_an_error(client):
    lease_id, _ = await client.grant(60)
    await client.revoke(lease_id)
    await client.revoke(lease_id)  # NOT_FOUND: already gone is what we wanted


async def test_a_revision_going_back_is_reported_as_a_reset(private_etcd, tmp_path):
    """A restore from an older snapshot: the store's revision goes back, the client says so."""
    snapshot = tmp_path / "backup.db"
    client = EtcdClient(EtcdOptions(parse_endpoints(private_etcd.endpoint), timeout=2))
    try:
        await client.put(b"/r/a", b"1")
        await asyncio.to_thread(private_etcd.ctl, "snapshot", "save", str(snapshot))
        for i in range(5):
            latest = await client.put(b"/r/b", str(i).encode())
        await client.get(b"/r/a")
        assert client.take_reset() is None
        await asyncio.to_thread(private_etcd.restore, snapshot)
        async def read_back() -> bool:
            try:
                return (await client.get(b"/r/a"))[0] is not None
            except EtcdUnavailable:
                return False
        await async_wait_until(read_back, timeout=20, what="etcd back from the snapshot")
        reset = client.take_reset()
        assert reset is not None and reset.startswith(f"the etcd revision went back from {latest}")
        # Once noticed, the new history is the reference: no second report.
        await client.put(b"/r/c", b"x")
        assert client.take_reset() is None
    finally:
        await client.close()


def test_a_test_etcd_whose_port_was_taken_before_it_bound_starts_on_others(tmp_path):
    """A free port checked, then taken by another process (an outgoing connection's local
    port) before etcd binds it: the throw-away etcd of the tests and the lab starts on new
    ports instead of failing the test that asked for it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EtcdServer(tmp_path / "etcd")
        server.client_port = taken.getsockname()[1]
        with server:
            assert server.client_port != taken.getsockname()[1]
            assert server.ctl("endpoint", "health", check=False).returncode == 0
