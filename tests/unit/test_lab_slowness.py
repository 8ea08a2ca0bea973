"""The lab's slowness factor: every wait of the lab and of the tests is scaled by
``FLANNEL_LAB_SLOWNESS``; a value that is no usable factor is refused by name."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flannel_lab import slowness
from flannel_lab.cluster import Lab, LabError, run
from tests.support.waiting import async_wait_until, wait_until


def test_unset_or_empty_is_one_and_a_number_scales_every_bound(monkeypatch):
    monkeypatch.delenv(slowness.ENV, raising=False)
    assert (slowness.factor(), slowness.scaled(30), slowness.within(69)) == (1.0, 30, "69s")
    monkeypatch.setenv(slowness.ENV, " ")
    assert slowness.factor() == 1.0
    monkeypatch.setenv(slowness.ENV, "12.5")
    assert slowness.scaled(30) == 375.0
    assert slowness.within(69) == "862.5s (69s x FLANNEL_LAB_SLOWNESS=12.5)"


@pytest.mark.parametrize("value", ["0.5", "0", "-3", "1001", "nan", "inf", "fast", "1e400"])
def test_a_value_that_is_no_factor_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(slowness.ENV, value)
    with pytest.raises(slowness.SlownessError, match=r"^FLANNEL_LAB_SLOWNESS=.*: give a number "
                                                     r"from 1 to 1000"):
        slowness.factor()
    # The lab refuses it before building anything, as a LabError flannel-lab prints.
    with pytest.raises(LabError, match="FLANNEL_LAB_SLOWNESS"):
        Lab("slowtest", root=Path("/nonexistent"))


def test_a_condition_slower_than_the_bound_is_waited_for_when_the_machine_is_slow(monkeypatch):
    start = time.monotonic()

    def ready() -> bool:
        return time.monotonic() - start > 0.6

    monkeypatch.delenv(slowness.ENV, raising=False)
    with pytest.raises(AssertionError, match=r"timed out after 0.2s waiting for ready"):
        wait_until(ready, timeout=0.2, interval=0.02, what="ready")
    start = time.monotonic()
    monkeypatch.setenv(slowness.ENV, "10")
    assert wait_until(ready, timeout=0.2, interval=0.02, what="ready")
    assert time.monotonic() - start < 2.0  # returned when the condition held, not at 2 s


async def test_the_async_wait_scales_alike(monkeypatch):
    start = time.monotonic()

    async def ready() -> bool:
        return time.monotonic() - start > 0.6

    monkeypatch.setenv(slowness.ENV, "10")
    assert await async_wait_until(ready, timeout=0.2, interval=0.02)
    monkeypatch.setenv(slowness.ENV, "1")
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.2s"):
        await async_wait_until(ready, timeout=0.2, interval=0.02)


def test_a_lab_command_gets_the_scaled_time_to_answer(monkeypatch):
    monkeypatch.setenv(slowness.ENV, "4")
    assert run(["sleep", "0.5"], timeout=0.25).returncode == 0
    monkeypatch.setenv(slowness.ENV, "1")
    with pytest.raises(LabError, match=r"sleep 0.5: no answer after 0.25s"):
        run(["sleep", "0.5"], timeout=0.25)


def test_the_labs_etcdctl_gets_the_scaled_time_to_dial_and_answer(monkeypatch, tmp_path):
    # An etcdctl that says how it was called: the timeouts it is given are its own bounds
    # (a dial and a command under an emulated CPU take many times their usual seconds).
    from flannel_lab import etcd

    echo = tmp_path / "etcdctl"
    echo.write_text('#!/bin/sh\necho "$@"\n')
    echo.chmod(0o755)
    monkeypatch.setattr(etcd, "ETCDCTL", str(echo))
    server = etcd.EtcdServer(tmp_path)
    monkeypatch.setenv(slowness.ENV, "1")
    assert "--command-timeout 5s --dial-timeout 2s" in server.ctl("get", "x").stdout
    monkeypatch.setenv(slowness.ENV, "30")
    assert "--command-timeout 150s --dial-timeout 60s" in server.ctl("get", "x").stdout
