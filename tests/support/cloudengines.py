"""What the cloud route engines' tests share: leases, every node's pass at once, a stop in
the middle of a hostile answer, and the checks of the options the access-key engines (ali-vpc,
tencent-vpc) read alike, each engine's ``from_backend`` passed in as ``read(members,
environ)``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv4Network
from typing import Any

import pytest

from flannel.backendconf.errors import BackendConfigError
from flannel.cloud.base import CloudError, ThrottleRetry
from flannel.lease import Lease
from flannel_lab import hostile
from flannel_lab.hostile import Witness
from tests.support.waiting import wait_until

NETWORK = IPv4Network("10.244.0.0/16")
SUBNETS = ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"]
#: Throttled calls retried at once: the tests do not wait out real backoff.
FAST = ThrottleRetry(attempts=5, base=0.01, cap=0.05)

Read = Callable[[dict[str, Any], dict[str, str]], Any]


def lease(cidr: str) -> Lease:
    return Lease(subnet=IPv4Network(cidr))


def reconcile_all(engines: Sequence[Any], subnets: Sequence[str] = SUBNETS) -> list[Any]:
    """One pass of each engine, node ``i`` holding ``subnets[i]`` and the others the rest."""
    leases = [lease(cidr) for cidr in subnets]
    return [engine.reconcile(leases[i], leases[:i] + leases[i + 1:])
            for i, engine in enumerate(engines)]


def stop_while_asking(engine: Any, asked: Callable[[], int], answer_lasts: float
                      ) -> tuple[float, list[str]]:
    """A pass of ``engine`` (holding SUBNETS[0], no peer) in a thread, stopped (``interrupt``)
    once ``asked()`` counts the call whose answer takes ``answer_lasts`` seconds and half a
    second into that answer: (seconds from the stop to the pass's end, the CloudErrors it
    ended with). The thread is waited for twice the answer's length at most."""
    outcome: list[str] = []

    def run() -> None:
        try:
            engine.reconcile(lease(SUBNETS[0]), [])
        except CloudError as error:
            outcome.append(str(error))

    before = asked()
    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: asked() > before, 10, what="the hostile call")
    time.sleep(0.5)  # inside the answer, not a bound: the stop is what is timed
    started = time.monotonic()
    engine.interrupt()
    thread.join(answer_lasts * 2)
    assert not thread.is_alive(), "the pass outlived the stop"
    return time.monotonic() - started, outcome


def redirected_pass(engine: Any, answer_with: Callable[[str, Any], None], status: int
                    ) -> tuple[str, str]:
    """A pass of ``engine`` (holding SUBNETS[0], no peer) whose DescribeRouteTables is
    answered by a redirect with ``status`` to another host of the test's own, which must see
    no request: (the CloudError the pass ended with, that host's address)."""
    witness = Witness().start()
    try:
        answer_with("DescribeRouteTables", hostile.redirect(status, f"{witness.url}/elsewhere"))
        with pytest.raises(CloudError) as raised:
            engine.reconcile(lease(SUBNETS[0]), [])
        assert witness.requests == []  # the signed request never reached the other host
    finally:
        witness.stop()
    return str(raised.value), witness.url.removeprefix("http://")


def full_table_error(engines: Sequence[Any], fill: Callable[[], None]) -> str:
    """Nodes 1 and 2 routed, then the table filled (``fill()``): node 3's pass fails. Its
    message, which the status holds too."""
    reconcile_all(engines[:2], SUBNETS[:2])
    fill()
    with pytest.raises(CloudError) as raised:
        engines[2].reconcile(lease(SUBNETS[2]), [lease(s) for s in SUBNETS[:2]])
    assert engines[2].status().last_error == str(raised.value)
    return str(raised.value)


def assert_keys_read_as_go_reads_them(read: Read, key_id: str, secret: str, cloud: str) -> None:
    """Both from the environment unless both are set; Go's message when neither has them;
    a member that is not a string refused by its name; a secret that is not printable
    refused as a malformed key of ``cloud``."""
    config = read({"AccessKeyID": "only-the-id"},
                  {"ACCESS_KEY_ID": key_id, "ACCESS_KEY_SECRET": secret})
    assert (config.access_key_id, config.access_key_secret) == (key_id, secret)
    with pytest.raises(BackendConfigError) as raised:
        read({}, {"ACCESS_KEY_ID": key_id})
    assert str(raised.value).startswith("ACCESS_KEY_ID and ACCESS_KEY_SECRET must be provided! ")
    with pytest.raises(BackendConfigError,
                       match=r"Backend\.AccessKeySecret must be a string, not a"):
        read({"AccessKeyID": key_id, "AccessKeySecret": 7}, {})
    with pytest.raises(BackendConfigError, match=f"the {cloud} access key is malformed"):
        read({"AccessKeyID": key_id, "AccessKeySecret": "a\nb"}, {})


def assert_refused(read: Read, members: dict[str, Any], message: str, secret: str) -> None:
    """``members`` refused with a message starting with ``message``, the secret not in it."""
    with pytest.raises(BackendConfigError) as raised:
        read(members, {})
    assert str(raised.value).startswith(message)
    assert secret not in str(raised.value)
