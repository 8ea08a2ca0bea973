"""The lab's record of what it created: a process is signalled only while its pid still
names the process the lab started, and a state file that cannot be trusted is refused."""

from __future__ import annotations

import signal
import subprocess

import pytest

from flannel_lab import cluster
from flannel_lab.cluster import Lab, LabError


def test_a_pid_is_signalled_only_while_it_is_the_process_the_lab_started():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started = cluster._start_ticks(proc.pid)
        assert started > 0
        # The same pid with another start time: a reused pid, someone else's process.
        assert cluster._stop_pid(proc.pid, started + 1, signal.SIGTERM, 1.0) is None
        assert proc.poll() is None
        assert cluster._stop_pid(proc.pid, started, signal.SIGTERM, 5.0) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert cluster._start_ticks(proc.pid) == 0


@pytest.mark.parametrize(("content", "why"), [
    ("{", "Expecting property name enclosed in double quotes"),
    ('{"name": "other", "directory": "/x"}', "describes another lab"),
    ('{"name": "lab1", "directory": "/x", "nodes": [{"index": 1}]}', "missing"),
    ("[]", "has no attribute"),
])
def test_an_unusable_state_file_is_refused(tmp_path, content, why):
    (tmp_path / "lab1").mkdir()
    (tmp_path / "lab1" / "state.json").write_text(content)
    with pytest.raises(LabError, match=why) as caught:
        Lab("lab1", root=tmp_path)
    assert str(tmp_path / "lab1" / "state.json") in str(caught.value)


def test_no_state_file_means_nothing_recorded(tmp_path):
    (tmp_path / "lab1").mkdir()
    lab = Lab("lab1", root=tmp_path)
    assert lab.exists and not lab.owns_directory and lab.state.namespaces == []
    lab.down()  # nothing recorded: the directory someone else made stays
    assert (tmp_path / "lab1").is_dir()
