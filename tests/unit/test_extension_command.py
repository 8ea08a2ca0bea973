"""Extension commands: Go's whitespace split and ``os.Expand`` rules, run without a shell."""

import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flannel.extension.command import OUTPUT_LIMIT, expand, run_command, split_and_expand
from tests.support.fuzzing import examples
from tests.support.waiting import wait_until

ENV = {"SUBNET": "10.5.2.0/24", "PUBLIC_IP": "192.168.1.2", "SPACED": "a b", "A": "x",
       "1": "one"}


@pytest.mark.parametrize(("word", "expanded"), [
    ("$SUBNET", "10.5.2.0/24"),
    ("${SUBNET}", "10.5.2.0/24"),
    ("via-${PUBLIC_IP}:8472", "via-192.168.1.2:8472"),
    ("$PUBLIC_IP.x", "192.168.1.2.x"),       # "." ends a name
    ("$A$A${A}", "xxx"),
    ("$UNSET-", "-"),                        # unknown names expand to ""
    ("cost$", "cost$"),                      # a trailing "$" stays
    ("$(id)", "$(id)"),                      # no command substitution: "$" stays
    ("a$%b", "a$%b"),
    ("${}x", "x"),                           # bad syntax "${}" is eaten
    ("${SUBNET", "SUBNET"),                  # unterminated: "${" is eaten
    ("$1st", "onest"),                       # a digit is a one-character special name
    ("${1}", "one"),
    ("$$", ""),                              # "$$" names variable "$" (unset)
])
def test_expansion_follows_go_os_expand(word, expanded):
    assert expand(word, ENV) == expanded


def test_split_happens_before_expansion():
    assert split_and_expand("  ip route add\t$SUBNET   via\n$PUBLIC_IP  ", ENV) == [
        "ip", "route", "add", "10.5.2.0/24", "via", "192.168.1.2"]
    # A value with spaces stays one argument; quotes are ordinary characters.
    assert split_and_expand("echo $SPACED 'a b'", ENV) == ["echo", "a b", "'a", "b'"]
    assert split_and_expand("   ", ENV) == []


def test_no_shell_interprets_the_command():
    result = run_command("echo a && echo $(id) ; $SUBNET | wc", ENV)
    assert result.ok and result.output == "a && echo $(id) ; 10.5.2.0/24 | wc"


def test_the_child_gets_process_and_call_environment_and_stdin(monkeypatch):
    monkeypatch.setenv("FROM_PROCESS", "p")
    script = ("import os, sys; print(os.environ['FROM_PROCESS'], os.environ['SUBNET'], "
              "repr(sys.stdin.read()))")
    result = run_command(f"{sys.executable} -c $SCRIPT", {"SUBNET": "10.5.2.0/24",
                                                          "SCRIPT": script},
                         stdin="aa:bb\n")
    assert result.ok and result.output == "p 10.5.2.0/24 'aa:bb\\n'"


def test_call_environment_overrides_the_process_environment(monkeypatch):
    monkeypatch.setenv("SUBNET", "from-process")
    assert run_command("echo $SUBNET", {"SUBNET": "10.5.2.0/24"}).output == "10.5.2.0/24"
    assert run_command("echo $SUBNET", {}).output == "from-process"


def test_failures_say_why_and_keep_the_output():
    failed = run_command("ls /nonexistent-extension-path", {})
    assert not failed.ok and failed.reason() == "exit status 2"
    assert "/nonexistent-extension-path" in failed.output
    missing = run_command("no-such-extension-command arg", {})
    assert not missing.ok
    assert missing.reason() == "cannot run no-such-extension-command: No such file or directory"
    assert run_command("", {}).reason() == "the command is empty"


def test_a_command_that_hangs_is_killed_with_its_children():
    script = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '30']); "
              "print(p.pid, flush=True); time.sleep(30)")
    result = run_command(f"{sys.executable} -c $S", {"S": script}, timeout=1.0)
    assert not result.ok and result.reason() == "timed out after 1s (killed)"
    child = int(result.output)

    # The grandchild was in the command's process group and got the same SIGKILL.
    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{child}/stat") as f:
            return f.read().split()[2] == "Z"
    wait_until(gone, timeout=5, what="the command's child to be killed")


def test_output_is_bounded_and_stdin_cannot_block():
    big = run_command("head -c 1000000 /dev/urandom", {})
    assert big.ok and big.output.endswith("[output truncated]")
    assert len(big.output.encode("utf-8", "surrogatepass")) < OUTPUT_LIMIT * 4
    # A command that never reads its stdin still finishes; a large stdin does not block.
    assert run_command("true", {}, stdin="x" * 2_000_000).ok
    assert run_command("sleep 0.2", {}, stdin="x" * 2_000_000, timeout=5).ok


@settings(max_examples=examples(300), deadline=None)
@given(st.text(alphabet=st.sampled_from(list("${}_aAz19*#@ \t")), max_size=40))
def test_expansion_never_fails_and_leaves_dollar_free_text_alone(word):
    out = expand(word, ENV)
    assert isinstance(out, str)
    if "$" not in word:
        assert out == word
