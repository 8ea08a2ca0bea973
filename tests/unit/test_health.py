"""/readyz text: says what is wrong, never where (it is served on every address by default)."""

from __future__ import annotations

import re

import pytest

from flannel.health import REASON_LIMIT, HealthServer, public_reason

ANY_PATH = re.compile(r"(?<![\w.:])[~.]*/\w")


def readyz_body(reason: str) -> str:
    reply = HealthServer(lambda: (False, reason)).answer("GET", "/readyz")
    head, _, body = reply.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 503 ")
    return body


@pytest.mark.parametrize(("reason", "body"), [
    ("could not write /run/flannel/subnet.env: Permission denied",
     "could not write subnet.env: Permission denied"),
    ("traffic rules not installed: /srv/bin/iptables: [Errno 8] Exec format error: "
     "'/srv/bin/iptables'",
     "traffic rules not installed: iptables: [Errno 8] Exec format error: 'iptables'"),
    ("lease /coreos.com/network/subnets/10.5.0.0-24 skipped",
     "lease 10.5.0.0-24 skipped"),
    ("cannot read ./keys/wg.key nor ~/wg.key nor ../wg/", "cannot read wg.key nor wg.key nor wg"),
])
def test_paths_are_cut_to_what_they_name(reason, body):
    assert readyz_body(reason) == f"flanneld is not ready yet: {body}\n"
    assert not ANY_PATH.search(body)


def test_networks_devices_and_addresses_stay():
    reason = ("data plane not programmed: route 10.244.1.0/24 via 10.244.1.0 dev flannel.1 "
              "and fd00:10:244:1::/64 missing")
    assert public_reason(reason) == reason


def test_one_bounded_line():
    text = public_reason("first\nsecond\r\x00third " + "x" * 1000)
    assert text.startswith("first second third x")
    assert len(text) == REASON_LIMIT and text.endswith("...")
