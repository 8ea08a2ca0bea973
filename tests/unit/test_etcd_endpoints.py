"""``--etcd-endpoints`` and ``--etcd-prefix`` read as Go flannel reads them: the endpoint
forms of Go's etcd client and the keys Go's ``path.Join`` makes from a prefix."""

from __future__ import annotations

import pytest

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.subnet.etcd.manager import EtcdSubnetManager


@pytest.mark.parametrize(("text", "target", "server_name"), [
    ("unix:///run/etcd/etcd.sock", "unix:///run/etcd/etcd.sock", "etcd.sock"),
    ("unix://etcd.sock", "unix:etcd.sock", "etcd.sock"),
    ("unix:run/etcd.sock", "unix:run/etcd.sock", "etcd.sock"),
    ("unixs:///run/localhost:2379", "unix:///run/localhost:2379", "localhost"),
])
def test_unix_endpoint_forms(text, target, server_name):
    (endpoint,) = parse_endpoints(text)
    assert (endpoint.target, endpoint.server_name) == (target, server_name)


@pytest.mark.parametrize(("text", "plain", "with_cert"), [
    ("http://127.0.0.1:2379", False, False),   # Go drops TLS on http://
    ("https://127.0.0.1:2379", True, True),    # and always uses it on https://
    ("unixs:///run/etcd.sock", True, True),
    ("unix:///run/etcd.sock", False, True),    # TLS when a client certificate is given
    ("127.0.0.1:2379", False, True),
])
def test_which_endpoints_use_tls(text, plain, with_cert):
    (endpoint,) = parse_endpoints(text)
    assert endpoint.uses_tls(False) is plain
    assert endpoint.uses_tls(True) is with_cert


@pytest.mark.parametrize(("prefix", "config", "subnets"), [
    ("/coreos.com/network", b"/coreos.com/network/config", b"/coreos.com/network/subnets/"),
    ("coreos.com/network", b"coreos.com/network/config", b"coreos.com/network/subnets/"),
    ("/coreos.com/network/", b"/coreos.com/network/config", b"/coreos.com/network/subnets/"),
    ("//a//b/", b"/a/b/config", b"/a/b/subnets/"),
    ("/a/./b/../c", b"/a/c/config", b"/a/c/subnets/"),
    ("", b"config", b"subnets/"),
    ("/", b"/config", b"/subnets/"),
    # Go compiles the prefix into a regular expression and panics on this one.
    ("/a(b[/network", b"/a(b[/network/config", b"/a(b[/network/subnets/"),
])
def test_prefix_makes_the_keys_go_makes(prefix, config, subnets):
    client = EtcdClient(EtcdOptions(parse_endpoints("http://127.0.0.1:2379")))
    sm = EtcdSubnetManager(client, prefix)
    assert sm.config_key == config
    assert sm.subnets_prefix == subnets
    assert sm.lease_key("10.5.34.0-24") == subnets + b"10.5.34.0-24"


def test_a_client_certificate_with_an_http_endpoint_is_warned_about(tmp_path, caplog):
    """Go's client drops TLS on http:// endpoints, certificate or not; we do the same and
    say so, since a certificate given suggests TLS was meant."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("unused")
    key.write_text("unused")
    EtcdClient(EtcdOptions(parse_endpoints("http://10.0.0.1:2379"), certfile=str(cert),
                           keyfile=str(key)))
    assert ("http://10.0.0.1:2379 is plain http: the client certificate is not used there "
            "(give https://10.0.0.1:2379 for TLS)") in caplog.text


def test_endpoints_are_trimmed_empty_ones_skipped_and_the_port_defaults_to_2379():
    """Go hands each comma-separated item to its client as it is: one with spaces around it
    or without a port never connects, an empty one is an endpoint that fails."""
    endpoints = parse_endpoints(" http://10.0.0.1 , ,https://10.0.0.2:2380,")
    assert [str(e) for e in endpoints] == ["http://10.0.0.1:2379", "https://10.0.0.2:2380"]
