"""The process's open-file limit, raised to its hard limit at start as Go programs do.

systemd starts services with a soft ``RLIMIT_NOFILE`` of 1024 (for the sake of programs
still using ``select()``) and a much higher hard limit, which a program may raise its soft
limit to. flanneld uses epoll and poll only, so it takes the hard limit: a burst of
connections or commands then runs into the limit the operator set (``LimitNOFILE=`` in the
unit), not into a default meant for other programs.
Must not touch: any other limit.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def raise_open_files_limit() -> tuple[int, int]:
    """Set the soft RLIMIT_NOFILE to the hard one; the (old, new) soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as err:  # e.g. a hard limit above fs.nr_open
        log.debug("open files limit stays at %d: raising it to the hard limit %d failed: %s",
                  soft, hard, err)
        return soft, soft
    log.debug("open files limit raised from %d to the hard limit %d", soft, hard)
    return soft, hard
