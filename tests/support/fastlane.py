"""The fast lane's guard: a run whose ``-m`` expression deselects the ``netns`` and ``etcd``
tests must create no network namespace and start no etcd.

Markers say what a test does only if someone remembered to add them; this plugin checks it.
In such a run every process a test starts is looked at before it starts: ``ip netns add``,
``unshare --net`` and ``etcd`` are refused (nothing is created, so a killed run leaves
nothing behind) and the test fails, naming the marker it lacks. Owns no fixture a test
uses; it only watches ``subprocess.Popen`` (which ``subprocess.run`` and asyncio's
subprocesses go through) for the duration of each test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence

import pytest
from _pytest.mark.expression import Expression


def is_fast_lane(markexpr: str) -> bool:
    """Whether ``markexpr`` deselects a test marked only netns and one marked only etcd."""
    if not markexpr.strip():
        return False
    expression = Expression.compile(markexpr)

    def selects(*marks: str) -> bool:
        return expression.evaluate(lambda name, **_: name in marks)

    return not selects("netns") and not selects("etcd")


def forbidden(argv: Sequence[str]) -> str | None:
    """The marker a test needs to run ``argv``, or None when the fast lane may run it."""
    words = [os.path.basename(str(word)) if i == 0 else str(word) for i, word in enumerate(argv)]
    if not words:
        return None
    if words[0] == "ip" and "netns" in words:
        after = words[words.index("netns") + 1:]
        if after[:1] == ["add"] or after[:1] == ["a"]:
            return "netns"
    if words[0] == "unshare" and any(w in ("-n", "--net") or w.startswith("--net=")
                                     for w in words[1:]):
        return "netns"
    if words[0] in ("etcd", "etcd-server"):
        return "etcd"
    return None


_CAUGHT = pytest.StashKey[list[str]]()


class FastLaneViolation(RuntimeError):
    """A test in the fast lane tried to create a namespace or start etcd."""


@pytest.fixture(autouse=True)
def _fast_lane_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    if not is_fast_lane(request.config.getoption("markexpr", "") or ""):
        yield
        return
    caught: list[str] = []
    request.node.stash[_CAUGHT] = caught
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args, *rest, **kwargs) -> None:  # type: ignore[no-untyped-def]
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if kwargs.get("shell") and argv:
            argv = str(argv[0]).split()
        marker = forbidden([os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else a
                            for a in argv])
        if marker is not None:
            message = (f"{' '.join(map(str, argv))}: a test in the fast lane may not do this; "
                       f"mark it pytest.mark.{marker}")
            caught.append(message)
            raise FastLaneViolation(message)
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    # A test that caught the refusal and went on still fails.
    report = yield
    caught = item.stash.get(_CAUGHT, None)
    if report.when == "call" and caught and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(caught)
    return report
