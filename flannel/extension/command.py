"""Run an extension command the way Go flannel (since v0.28.2) does, without a shell.

Owns: splitting a command string on whitespace (Go's ``strings.Fields``), expanding
``$VAR`` / ``${VAR}`` in each word as Go's ``os.Expand`` does (from the process environment
overlaid with the per-call variables; unknown names expand to ""), executing the words
directly with that environment (inside the ``Host``'s network namespace), feeding stdin,
a timeout that kills the command's whole process group, and capturing combined
stdout+stderr (bounded, trimmed).

API: ``split_and_expand(command, env) -> list[str]``, ``expand(word, env)``,
``run_command(command, call_env, stdin="", timeout=30.0, host=LOCAL) -> CommandResult``
(never raises for a failing command: the result says why). Synchronous: call from a worker thread.
Must not touch: anything but the child process it starts.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

from flannel.kernel.host import LOCAL, Host

DEFAULT_TIMEOUT = 30.0
OUTPUT_LIMIT = 64 * 1024
_SPECIAL = set("*#$@!?-0123456789")


def _is_name_char(ch: str) -> bool:
    return ch == "_" or ("0" <= ch <= "9") or ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _shell_name(s: str) -> tuple[str, int]:
    """Go's ``getShellName``: the variable name after a ``$`` and how many bytes it takes."""
    if s[0] == "{":
        if len(s) > 2 and s[1] in _SPECIAL and s[2] == "}":
            return s[1], 3
        end = s.find("}", 1)
        if end == 1:
            return "", 2  # "${}": bad syntax, eaten
        if end > 1:
            return s[1:end], end + 1
        return "", 1  # "${" without "}": bad syntax, "${" eaten
    if s[0] in _SPECIAL:
        return s[0], 1
    i = 0
    while i < len(s) and _is_name_char(s[i]):
        i += 1
    return s[:i], i


def expand(word: str, env: Mapping[str, str]) -> str:
    """``$VAR`` and ``${VAR}`` replaced as Go's ``os.Expand`` replaces them."""
    out: list[str] = []
    i = j = 0
    while j < len(word):
        if word[j] == "$" and j + 1 < len(word):
            out.append(word[i:j])
            name, width = _shell_name(word[j + 1:])
            if name:
                out.append(env.get(name, ""))
            elif width == 0:
                out.append("$")  # "$" not followed by a name stays
            j += width
            i = j + 1
        j += 1
    out.append(word[i:])
    return "".join(out)


def split_and_expand(command: str, env: Mapping[str, str]) -> list[str]:
    """Whitespace split first, then expansion per word: a value with spaces stays one word."""
    return [expand(word, env) for word in command.split()]


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None: did not run to completion
    output: str
    error: str = ""  # why it failed when not by its exit status

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.error

    def reason(self) -> str:
        if self.error:
            return self.error
        if self.returncode is not None and self.returncode < 0:
            return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"


def _exchange(proc: subprocess.Popen[bytes], stdin: bytes, deadline: float) -> tuple[bytes, bool]:
    """Feed stdin and read combined output until EOF or the deadline, without blocking on
    either pipe; keep at most OUTPUT_LIMIT bytes of output."""
    assert proc.stdout is not None and proc.stdin is not None
    kept = bytearray()
    dropped = False
    pending = memoryview(stdin)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(kept), True
            for key, _events in sel.select(left):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(proc.stdin.fileno(), pending):]
                    except (BrokenPipeError, BlockingIOError) as err:
                        if isinstance(err, BrokenPipeError):
                            pending = pending[:0]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return bytes(kept) + (b"\n[output truncated]" if dropped else b""), False
                room = OUTPUT_LIMIT - len(kept)
                kept += chunk[:room]
                dropped = dropped or len(chunk) > room


def run_command(command: str, call_env: Mapping[str, str], stdin: str = "",
                timeout: float = DEFAULT_TIMEOUT, host: Host = LOCAL) -> CommandResult:
    env = {**os.environ, **call_env}
    argv = split_and_expand(command, env)
    if not argv:
        return CommandResult((), None, "", "the command is empty")
    deadline = time.monotonic() + timeout
    try:
        proc = subprocess.Popen(host.command(argv), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, close_fds=True,
                                start_new_session=True)
    except OSError as err:
        return CommandResult(tuple(argv), None, "",
                             f"cannot run {argv[0]}: {err.strerror or err}")
    try:
        raw, timed_out = _exchange(proc, stdin.encode(), deadline)
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        returncode = proc.wait(timeout=max(0.1, deadline - time.monotonic()) + 5)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()
    output = raw.decode("utf-8", "replace").strip()
    if timed_out:
        return CommandResult(tuple(argv), None, output,
                             f"timed out after {timeout:g}s (killed)")
    return CommandResult(tuple(argv), returncode, output)
