"""How the operator tools (``flannelctl``, ``flannel-lab``) end when they are stopped from
outside: Ctrl-C (SIGINT), SIGTERM, or their output closed (a pipe whose reader ended, as
``| head`` does).

Owns the handlers of SIGINT and SIGTERM while a tool runs (``run``): each raises an exception
that unwinds the command as Ctrl-C does (``Terminated`` is a ``KeyboardInterrupt``), so every
``finally`` and clean-up runs; ``held`` blocks, in which a signal waits until the block ends
(starting a process or creating a namespace and recording it are one step, never half done);
telling a closed output from any other broken pipe; and the one line, on stderr, and the exit
status each stop ends with, as a shell reports a process those signals end: 130 (SIGINT),
143 (SIGTERM), 141 (SIGPIPE). Never a traceback. A command that must undo something on a
stop adds what it did to the exception (``add_note``), which ends up on that line.
Must not touch: anything but this process's SIGINT and SIGTERM handlers and its standard
output, which a closed output turns into /dev/null so that nothing is written to it again.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_SIGPIPE = 128 + signal.SIGPIPE


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the command unwinds as it does on Ctrl-C."""


class OutputClosed(KeyboardInterrupt):
    """Standard output was closed by its reader: nobody reads what the command says."""


_held = 0
_pending: list[int] = []


def _stop(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _held:
        if not _pending:
            _pending.append(signum)
        return
    raise _stop(signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends, then stop the command (only while
    ``run`` handles them: elsewhere, as in tests, the block changes nothing)."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending:
            signum = _pending.pop()
            raise _stop(signum)


@contextlib.contextmanager
def ignored() -> Iterator[None]:
    """Ctrl-C and SIGTERM change nothing during the block (a clean-up after a stop, which
    is bounded, must not itself be cut short)."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held:
            _pending.clear()


def output_closed(err: BaseException | None = None) -> bool:
    """Whether standard output is a pipe whose reader went away (``err``, if given, must be
    the broken pipe that said so)."""
    if isinstance(err, OutputClosed):
        return True
    if err is not None and not isinstance(err, BrokenPipeError):
        return False
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _fd, events in poller.poll(0))


def _silence_stdout() -> None:
    """Nothing more reaches the closed output (not even the buffer flushed at exit)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def ending(prog: str, err: BaseException) -> tuple[str, int]:
    """The line and exit status of a command stopped by ``err``."""
    if isinstance(err, OutputClosed | BrokenPipeError):
        what, code = "stopped: its output was closed", EXIT_SIGPIPE
    elif isinstance(err, Terminated):
        what, code = "terminated (SIGTERM)", EXIT_SIGTERM
    else:
        what, code = "interrupted (Ctrl-C)", EXIT_SIGINT
    notes = "; ".join(getattr(err, "__notes__", ()))
    return f"{prog}: {what}" + (f"; {notes}" if notes else ""), code


def run(prog: Callable[[], str], command: Callable[[], int]) -> int:
    """Run ``command`` with SIGINT and SIGTERM unwinding it; its exit status, or that of
    the stop that ended it, said in one line that starts with ``prog()`` (the tool and
    its verb, once the command line is read)."""
    # Handlers belong to the main thread (a tool called from another, as a test may, keeps
    # the process's).
    handlers = ({sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        code = command()
        sys.stdout.flush()  # a closed output is found here, not at exit
        return code
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM, or a closed output said so
        stop: BaseException = err
    except BrokenPipeError as err:
        if not output_closed(err):
            raise
        stop = err
    finally:
        for sig, handler in handlers.items():
            if handler is not None:  # None: one set outside Python, which stays ours
                signal.signal(sig, handler)
    if output_closed(stop):
        _silence_stdout()
    line, code = ending(prog(), stop)
    _say(line)
    return code
