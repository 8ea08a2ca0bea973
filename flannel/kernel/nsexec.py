"""Run a program inside a named network namespace with a private ``/run``.

``python -m flannel.kernel.nsexec [--netns NAME] [--run-dir DIR [--keep PATH]...] --
PROGRAM ARGS...`` enters ``/run/netns/NAME``, and with ``--run-dir`` unshares the mount
namespace and binds DIR over ``/run`` (so wireguard-go's ``/var/run/wireguard/<ifname>.sock``
lands in ``DIR/wireguard/``, private to this node), then execs PROGRAM (no shell). Each
``--keep`` path under ``/run`` (e.g. a lab directory) stays visible at the same place: it is
bound over a directory of that name created in DIR before DIR covers ``/run``. For labs and
tests where several nodes on one host run a device of the same name (the lab runs each
node's flanneld this way, so its key, wireguard-go and socket are the node's own); flanneld
on a real node runs wireguard-go directly.

API: ``command(argv, host, run_dir, keep) -> list[str]`` (the argv to run ``argv`` that way).
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


def command(argv: Sequence[str], host: Host, run_dir: Path | None,
            keep: Sequence[Path] = ()) -> list[str]:
    if not host.netns and run_dir is None:
        return list(argv)
    opts = [*(["--netns", host.netns] if host.netns else []),
            *(["--run-dir", str(run_dir)] if run_dir is not None else []),
            *(arg for path in keep for arg in ("--keep", str(path)))]
    return [sys.executable, "-m", "flannel.kernel.nsexec", *opts, "--", *argv]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _private_run(libc: ctypes.CDLL, run_dir: Path, keep: Sequence[Path]) -> None:
    kept = []
    for path in keep:
        relative = path.relative_to("/run") if path.is_relative_to("/run") else None
        if relative is None or ".." in relative.parts or not relative.parts:
            raise ValueError(f"--keep {path}: give a directory under /run")
        kept.append((path, relative))
    _check(libc.unshare(CLONE_NEWNS), "unsharing the mount namespace")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None),
           "making mounts private")
    # Kept paths are bound into DIR first; DIR, with them, then covers /run.
    for path, relative in kept:
        target = run_dir / relative
        target.mkdir(parents=True, exist_ok=True)
        _check(libc.mount(bytes(path), bytes(target), None, MS_BIND | MS_REC, None),
               f"keeping {path}")
    _check(libc.mount(bytes(run_dir), b"/run", None, MS_BIND | MS_REC, None),
           f"binding {run_dir} over /run")


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nsexec")
    parser.add_argument("--netns")
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--keep", type=Path, action="append", default=[])
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
            _private_run(libc, opts.run_dir, opts.keep)
        os.execvp(argv[0], argv)  # noqa: S606 - exec of the given argv, no shell
    except OSError as err:
        print(f"nsexec: {err.strerror or err}: {err.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 127
    except ValueError as err:
        print(f"nsexec: {err}", file=sys.stderr)
        return 2
    return 0  # not reached: execvp replaced the process


if __name__ == "__main__":
    sys.exit(main())
