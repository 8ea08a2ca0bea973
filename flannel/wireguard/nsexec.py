"""Run a program inside a named network namespace with a private ``/run``.

``python -m flannel.wireguard.nsexec [--netns NAME] [--run-dir DIR] -- PROGRAM ARGS...``
enters ``/run/netns/NAME``, and with ``--run-dir`` unshares the mount namespace and binds DIR
over ``/run`` (so wireguard-go's ``/var/run/wireguard/<ifname>.sock`` lands in
``DIR/wireguard/``, private to this node), then execs PROGRAM (no shell). For labs and tests
where several nodes on one host run a device of the same name; flanneld on a real node runs
wireguard-go directly.

API: ``command(argv, host, run_dir) -> list[str]`` (the argv to run ``argv`` that way).
Must not touch: the caller's namespaces (only the new process's are changed).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from flannel.kernel.host import Host

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000


def command(argv: Sequence[str], host: Host, run_dir: Path | None) -> list[str]:
    if not host.netns and run_dir is None:
        return list(argv)
    opts = [*(["--netns", host.netns] if host.netns else []),
            *(["--run-dir", str(run_dir)] if run_dir is not None else [])]
    return [sys.executable, "-m", "flannel.wireguard.nsexec", *opts, "--", *argv]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nsexec")
    parser.add_argument("--netns")
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    opts = parser.parse_args(args)
    argv = opts.argv[1:] if opts.argv[:1] == ["--"] else opts.argv
    if not argv:
        parser.error("no program given")
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if opts.netns:
            fd = os.open(Path("/run/netns") / opts.netns, os.O_RDONLY | os.O_CLOEXEC)
            _check(libc.setns(fd, CLONE_NEWNET), f"entering network namespace {opts.netns}")
            os.close(fd)
        if opts.run_dir is not None:
            _check(libc.unshare(CLONE_NEWNS), "unsharing the mount namespace")
            _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None),
                   "making mounts private")
            _check(libc.mount(bytes(opts.run_dir), b"/run", None, MS_BIND, None),
                   f"binding {opts.run_dir} over /run")
        os.execvp(argv[0], argv)  # noqa: S606 - exec of the given argv, no shell
    except OSError as err:
        print(f"nsexec: {err.strerror or err}: {err.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 127
    return 0  # not reached: execvp replaced the process


if __name__ == "__main__":
    sys.exit(main())
