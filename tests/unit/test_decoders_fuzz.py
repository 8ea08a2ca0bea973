"""Property tests: every decoder flanneld applies to the store, its files and the udp
backend's datagrams survives hostile input (targets in tests/support/fuzz_store.py,
tests/support/fuzz_backends.py and tests/support/fuzz_udp.py; bench/fuzz.py runs many
more)."""

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support import fuzz_backends, fuzz_store, fuzz_udp

EXAMPLES = 300
TARGETS = fuzz_store.TARGETS + fuzz_backends.TARGETS + fuzz_udp.TARGETS


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_decoder_accepts_or_refuses_but_never_crashes(target):
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target.inputs)
    def one(value):
        target.run(value)

    one()
