"""Property tests: every decoder flanneld applies to the store, its files, the udp
backend's datagrams, the API servers' HTTP responses, the answers of etcd and the
Kubernetes API, and what the cloud APIs, metadata services, charon and WireGuard answer
survives hostile input (targets in tests/support/fuzz_store.py, fuzz_backends.py,
fuzz_udp.py, fuzz_http.py, fuzz_answers.py and fuzz_cloud.py; bench/fuzz.py runs many
more).

Each target runs hypothesis's own default of 100 examples a run (fresh random ones every run,
no database), a fifth in the fast lane; ``bench.fuzz --examples 10000`` is the deep search."""

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support import (
    fuzz_answers,
    fuzz_backends,
    fuzz_cloud,
    fuzz_http,
    fuzz_store,
    fuzz_udp,
)
from tests.support.fuzzing import examples

TARGETS = (fuzz_store.TARGETS + fuzz_backends.TARGETS + fuzz_udp.TARGETS + fuzz_http.TARGETS
           + fuzz_answers.TARGETS + fuzz_cloud.TARGETS)


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_decoder_accepts_or_refuses_but_never_crashes(target):
    @settings(max_examples=examples(100), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target.inputs)
    def one(value):
        target.run(value)

    one()
