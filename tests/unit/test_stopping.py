"""How the operator tools end when stopped from outside (flannel/process/stopping.py): a real signal
sent to a real process, a real pipe whose reader is gone. Each ends with one line on stderr
and the status a shell reports for that signal, never a traceback; what a command adds to
the stop (what it undid) is on that line; a block that records what it starts lets a
signal wait until it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flannel.process import stopping

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")

# A tool that says it is ready, then waits; a stop must unwind it through its ``finally``.
WAITER = """
import sys, time
from flannel.process import stopping

def command():
    try:
        with stopping.held():
            print("holding", flush=True)
            time.sleep({hold})
            print("held to the end", flush=True)
        print("ready", flush=True)
        time.sleep(30)
    except KeyboardInterrupt as err:
        err.add_note("cleaned up")
        raise
    return 0

sys.exit(stopping.run(lambda: "waiter", command))
"""


def start_waiter(hold: float = 0.0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WAITER.replace("{hold}", str(hold))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "holding\n"
    return proc


@pytest.mark.parametrize(("sig", "line", "code"), [
    (signal.SIGINT, "waiter: interrupted (Ctrl-C); cleaned up\n", 130),
    (signal.SIGTERM, "waiter: terminated (SIGTERM); cleaned up\n", 143),
])
def test_a_signal_unwinds_the_command_and_ends_it_in_one_line(sig, line, code):
    proc = start_waiter()
    assert proc.stdout.readline() == "held to the end\n"
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (code, "", line)


def test_a_signal_waits_for_the_end_of_a_held_block():
    proc = start_waiter(hold=1.0)
    proc.send_signal(signal.SIGTERM)  # during the block: it ends first, then the stop
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (143, "held to the end\n", "waiter: terminated "
                                                                    "(SIGTERM); cleaned up\n")


def closed_pipe() -> int:
    """The write end of a pipe whose reader is gone."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_a_closed_output_is_told_from_an_open_one():
    write = closed_pipe()
    try:
        code = subprocess.run([sys.executable, "-c", "from flannel.process import stopping; "
                               "print(stopping.output_closed(), file=__import__('sys').stderr)"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=30,
                              check=False)
    finally:
        os.close(write)
    assert code.stderr == "True\n"
    assert stopping.output_closed(ValueError()) is False
    read, write = os.pipe()
    try:
        opened = subprocess.run([sys.executable, "-c", "from flannel.process import stopping; "
                                 "print(stopping.output_closed(), file=__import__('sys')."
                                 "stderr)"], stdout=write, stderr=subprocess.PIPE, text=True,
                                timeout=30, check=False)
    finally:
        os.close(write)
        os.close(read)
    assert opened.stderr == "False\n"


def test_flannelctl_whose_output_is_closed_ends_in_one_line(tmp_path):
    write = closed_pipe()
    try:
        proc = subprocess.run([FLANNELCTL, "install-cni", "--plugin", "none",
                               f"--bin-dir={tmp_path}", f"--conf-dir={tmp_path}"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                              check=False)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "flannelctl install-cni: stopped: its "
                                                   "output was closed\n")


def test_another_broken_pipe_is_not_taken_for_a_closed_output():
    script = ("import os, sys\nfrom flannel.process import stopping\n"
              "def command():\n"
              "    read, write = os.pipe()\n"
              "    os.close(read)\n"
              "    os.write(write, b'x')\n"
              "sys.exit(stopping.run(lambda: 'tool', command))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 1
    assert "BrokenPipeError" in proc.stderr  # a bug surfaces: it is not a reader gone away
