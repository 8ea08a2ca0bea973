"""Property tests: the CNI plugin's fuzz targets (tests/support/fuzz_cni.py) never crash.

CI runs a few hundred examples of the in-process subnet.env reader and ~150 executions of
the real plugin (a fifth of that in the fast lane); ``bench/fuzz.py`` runs the same targets
10,000+ times.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.support.fuzz_cni import TARGETS
from tests.support.fuzzing import examples

BY_NAME = {target.name: target for target in TARGETS}


@settings(max_examples=examples(150), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(BY_NAME["cni stdin+env"].inputs)
def test_plugin_executable_answers_cni_json_on_any_input(case):
    BY_NAME["cni stdin+env"].run(case)


@settings(max_examples=examples(300), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(BY_NAME["cni subnet.env"].inputs)
def test_subnet_env_reader_refuses_only_with_cni_errors(data):
    BY_NAME["cni subnet.env"].run(data)
