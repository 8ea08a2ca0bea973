"""RetryLog: what a user reads while a store phase keeps failing."""

from __future__ import annotations

import logging

from flannel.subnet.errors import RetryLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_error_once_then_summaries_further_apart(caplog):
    clock = Clock()
    logger = logging.getLogger("test.retry")
    retries = RetryLog(logger, "Couldn't fetch network config", first_summary=5,
                       longest_summary=20, clock=clock)
    caplog.set_level(logging.INFO, logger="test.retry")
    for _ in range(60):  # one failure a second for a minute, always the same error
        retries.failed(TimeoutError("etcd paused"), 1.0)
        clock.now += 1
    retries.failed("a new error", 1.0)
    retries.succeeded()
    assert [r.getMessage() for r in caplog.records] == [
        "Couldn't fetch network config: etcd paused (retrying in 1.0s)",
        "Couldn't fetch network config: still failing after 6 attempts in 5s, latest: "
        "etcd paused",
        "Couldn't fetch network config: still failing after 16 attempts in 15s, latest: "
        "etcd paused",
        "Couldn't fetch network config: still failing after 36 attempts in 35s, latest: "
        "etcd paused",
        "Couldn't fetch network config: still failing after 56 attempts in 55s, latest: "
        "etcd paused",
        "Couldn't fetch network config: a new error (retrying in 1.0s)",
        "Couldn't fetch network config: succeeded after 61 failed attempts",
    ]


def test_many_distinct_errors_do_not_flood_the_log(caplog):
    clock = Clock()
    retries = RetryLog(logging.getLogger("test.retry"), "writing", clock=clock)
    caplog.set_level(logging.INFO, logger="test.retry")
    for i in range(1000):
        retries.failed(f"error {i}", 0.5)
    assert len(caplog.records) == RetryLog.MAX_DISTINCT
