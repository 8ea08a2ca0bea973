"""flannel-lab and flannelctl stopped as a user stops them: Ctrl-C (SIGINT) and SIGTERM sent
to the real command, its output into a pipe whose reader went away (``| head``). Each ends
with one line and 130, 143 or 141, never a traceback. ``flannel-lab up`` stopped halfway
removes everything it built so far (namespaces, etcd, every flanneld) and says so.
``flannel-lab status`` exits 1 naming a node whose flanneld is gone, which ``restart``
starts again with the flags it was started with. A flanneld that exits at start is told by
its last error and the path of its full log, kept when the lab is removed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from flannel.ops.commands import script
from flannel_lab.cluster import Lab
from tests.support.checkout import FLANNEL_LAB, FLANNELCTL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]



def lab_argv(lab: Lab, verb: str, *argv: str) -> list[str]:
    return [*FLANNEL_LAB, "--root", str(lab.directory.parent), verb, "--name", lab.name, *argv]


def lab_cli(lab: Lab, verb: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(lab_argv(lab, verb, *argv), capture_output=True, text=True,
                          timeout=180, check=False)


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left to a parent that does not collect it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def closed_pipe() -> int:
    """The write end of a pipe whose reader is gone."""
    read, write = os.pipe()
    os.close(read)
    return write


def run_into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess:
    write = closed_pipe()
    try:
        return subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=180, check=False)
    finally:
        os.close(write)


def nothing_left(lab: Lab, pids: list[int]) -> None:
    assert not {ns for ns in netns_names() if ns.startswith(f"{lab.name}-")}
    assert not [pid for pid in pids if running(pid)]
    assert not lab.directory.exists()


@pytest.mark.parametrize(("stop", "after", "line", "code"), [
    (signal.SIGINT, "creating node 2", "interrupted (Ctrl-C)", 130),
    (signal.SIGTERM, "creating node 2", "terminated (SIGTERM)", 143),
    (signal.SIGINT, "waiting until every node has routes", "interrupted (Ctrl-C)", 130),
    (signal.SIGTERM, "waiting until every node has routes", "terminated (SIGTERM)", 143),
    (None, "waiting until every node has routes", "stopped: its output was closed", 141),
])
def test_up_stopped_halfway_removes_what_it_built(make_lab, stop, after, line, code):
    lab = make_lab()
    proc = subprocess.Popen(lab_argv(lab, "up", "--nodes", "3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for said in proc.stdout:
        if after in said:
            break
    state = json.loads((lab.directory / "state.json").read_text())
    pids = [state["etcd_pid"], *(node["pid"] for node in state["nodes"] if node["pid"])]
    assert pids[0] and running(pids[0])
    if stop is None:
        proc.stdout.close()  # as head does once it has its lines
    else:
        proc.send_signal(stop)
    proc.wait(timeout=120)
    err = proc.stderr.read()
    assert (proc.returncode, err) == (
        code, f"flannel-lab up: {line}; lab {lab.name} removed: nothing it built is left\n")
    nothing_left(lab, pids)


@pytest.fixture
def lab2(make_lab):
    lab = make_lab()
    up = lab_cli(lab, "up", "--nodes", "2", "--flanneld-arg=--iptables-resync=7")
    assert up.returncode == 0, up.stdout + up.stderr
    return Lab(lab.name, root=lab.directory.parent)


def in_node(lab: Lab, index: int, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", lab.node_ns(index), *FLANNELCTL, *argv]


def test_every_verb_whose_output_is_closed_ends_in_one_line(lab2, tmp_path):
    lab = lab2
    own = lab.lease_key(1).replace("-", "/")
    archive = tmp_path / "n1.tar.gz"
    for argv in (["status"], ["status", "--json"], ["doctor"], ["doctor", "--json"],
                 ["check"], ["check", "--json"], ["leases", "list"],
                 ["leases", "list", "--json"], ["leases", "show", own],
                 ["leases", "show", own, "--json"], ["bundle", "-o", str(archive)],
                 ["cleanup", "--dry-run", "--force"]):
        ended = run_into_closed_pipe(in_node(lab, 1, *argv))
        assert (ended.returncode, ended.stderr) == (
            141, f"flannelctl {argv[0]}: stopped: its output was closed\n"), argv
    with tarfile.open(archive) as tar:  # written whole before it was to be said
        assert any(member.name.endswith("/status.txt") for member in tar.getmembers())

    for verb, argv in (("status", []), ("ping", []), ("restart", ["--node", "2"])):
        ended = run_into_closed_pipe(lab_argv(lab, verb, *argv))
        assert (ended.returncode, ended.stderr) == (
            141, f"flannel-lab {verb}: stopped: its output was closed\n"), verb
    assert lab_cli(lab, "status").returncode == 0  # restart said nothing, so did nothing
    state = Lab(lab.name, root=lab.directory.parent).state
    pids = [state.etcd_pid, *(node.pid for node in state.nodes)]
    ended = run_into_closed_pipe(lab_argv(lab, "down"))
    assert (ended.returncode, ended.stderr) == (141, "flannel-lab down: stopped: its output "
                                                     "was closed\n")
    nothing_left(lab, pids)  # removed before it was to be said


def raw_sockets(proc: subprocess.Popen) -> set[str]:
    """The inodes of the raw sockets process ``proc`` holds; it must still run."""
    if proc.poll() is not None:
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"ended ({proc.returncode}) before it probed: {out}{err}")
    pid = proc.pid
    table = Path(f"/proc/{pid}/net/raw").read_text().splitlines()[1:]
    inodes = {line.split()[9] for line in table}
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            held.add(os.readlink(fd).removeprefix("socket:[").removesuffix("]"))
    return inodes & held


@pytest.mark.parametrize(("stop", "line", "code"), [
    (signal.SIGINT, "interrupted (Ctrl-C)", 130),
    (signal.SIGTERM, "terminated (SIGTERM)", 143),
])
def test_check_stopped_while_it_probes_ends_in_one_line(lab2, stop, line, code):
    lab = lab2
    # --max-age=0: probe from here even when flanneld's own results are fresh.
    proc = subprocess.Popen(in_node(lab, 1, "check", "--count=100", "--interval=0.1",
                                    "--max-age=0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Probing: a raw ICMP socket of its own is open (flanneld's probes have theirs too).
    wait_until(lambda: raw_sockets(proc), 30, what="check probing")
    proc.send_signal(stop)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (code, "", f"flannelctl check: {line}\n")


def test_status_names_a_node_whose_flanneld_is_gone_and_restart_brings_it_back(lab2):
    lab = lab2
    gone = lab.node(2).pid
    os.kill(gone, signal.SIGKILL)
    wait_until(lambda: not running(gone), 15, what="node 2's flanneld gone")
    restart = (f"{script('flannel-lab')} --root {lab.directory.parent} restart --node 2 "
               f"--name {lab.name}")

    status = lab_cli(lab, "status")
    assert status.returncode == 1
    assert re.fullmatch(
        rf"flannel-lab: node 2: flanneld \(pid {gone}\) exited(, a zombie its parent has not "
        r"collected)?: no error in its log, whose last line is: [^\n]+; "
        rf"'{re.escape(restart)}' starts it again\n", status.stderr), status.stderr
    assert re.search(r"^--- node 2 .*, flanneld GONE$", status.stdout, re.MULTILINE)
    assert re.search(rf"^--- node 1 .*, flanneld pid {lab.node(1).pid}$", status.stdout,
                     re.MULTILINE)

    again = lab_cli(lab, "restart", "--node", "2")
    assert again.returncode == 0, again.stderr
    said = again.stdout.splitlines()
    assert said[0].startswith(f"==> node 2: flanneld (pid {gone}) exited")
    assert said[0].endswith("; restarting it with the flags it was started with: --ip-masq "
                            "--iptables-resync=7")
    now = Lab(lab.name, root=lab.directory.parent).node(2).pid
    assert now != gone and running(now)
    assert re.fullmatch(rf"==> node 2: flanneld \(pid {now}\) ready \d+\.\ds after it "
                        "started", said[1])
    argv = Path(f"/proc/{now}/cmdline").read_bytes().split(b"\0")
    assert b"--iptables-resync=7" in argv and b"--ip-masq" in argv
    assert lab_cli(lab, "status").returncode == 0
    assert lab_cli(lab, "ping").returncode == 0

    # Running, it is stopped first, then started the same way.
    third = lab_cli(lab, "restart", "--node", "2")
    assert third.stdout.splitlines()[0] == (
        f"==> node 2: flanneld (pid {now}) running; restarting it with the flags it was "
        "started with: --ip-masq --iptables-resync=7")
    assert not running(now)


def test_a_flanneld_that_exits_at_start_is_told_by_its_last_error(make_lab):
    lab = make_lab()
    config = ('{"Network": "10.244.0.0/16", "Backend": {"Type": "extension", '
              '"PreStartupCommand": "false"}}')
    kept = lab.directory.parent / f"{lab.name}-n1-flanneld.log"
    up = lab_cli(lab, "up", "--nodes", "1", f"--config={config}")
    try:
        assert up.returncode == 1
        assert up.stderr == (
            "flannel-lab: flanneld on node 1 exited: extension pre-startup command failed "
            "(exit status 1): false; output: (no output); extension pre-startup command failed "
            "(exit status 1): false; output: ; fix the command (it runs without a shell: write "
            "a script for pipes, redirections or several steps) (full log: "
            f"{kept}); lab {lab.name} removed: nothing it built is left\n")
        assert "CLI flags config:" in kept.read_text()  # the whole log, kept
        nothing_left(lab, [])
    finally:
        kept.unlink(missing_ok=True)


@pytest.mark.parametrize("verb", ["demo", "tour"])
def test_demo_and_tour_whose_reader_goes_away_remove_their_lab(make_lab, verb):
    lab = make_lab()
    proc = subprocess.Popen(lab_argv(lab, verb), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for said in proc.stdout:
        if "creating node 1" in said:
            break
    proc.stdout.close()
    proc.wait(timeout=120)
    assert (proc.returncode, proc.stderr.read()) == (
        141, f"flannel-lab {verb}: stopped: its output was closed; lab {lab.name} removed: "
             "nothing it built is left\n")
    nothing_left(lab, [])
