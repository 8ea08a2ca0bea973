"""Tests of files read from a path a user names: a FIFO there must be refused at once, never
waited on (opening one for reading blocks until a writer comes)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest


def outcome_of_reading(fifo: Path, attempt: Callable[[], str], what: str) -> str:
    """What ``attempt`` (which reads ``fifo``) returns, run in a thread; the test fails if it
    blocks for 5 s (the reader is released first, so nothing stays stuck)."""
    outcome: list[str] = []
    reader = threading.Thread(target=lambda: outcome.append(attempt()), daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # release the reader stuck in open()
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        pytest.fail(f"reading a FIFO as {what} blocked")
    assert len(outcome) == 1, outcome
    return outcome[0]
