"""Logging in klog's line format (``I1121 15:04:19.123456   4242 file.py:42] message``).

Owns the root logger's handler and level, and the ``-v`` levels: ``V1`` .. ``V9`` are
logging levels between INFO and DEBUG (``V(n)`` is INFO - n), so a record logged at ``V(n)``
shows when ``-v`` is n or more, as klog's ``V(n).Info``. What each level adds (README.md):
0 info, warnings, errors; 1 the reason for every data plane pass and store check; 2 a
line per peer subnet change; 4 every kernel change and etcd watch start; 6 iptables and
nftables payloads; 10 every library's debug records. Must not touch: anything else.
"""

from __future__ import annotations

import logging
import os
import sys
import time

#: The most verbose ``-v``: everything, libraries' debug records included.
MAX_VERBOSITY = 10


def v_level(n: int) -> int:
    """The logging level of klog's ``V(n)``."""
    return logging.INFO - n


V1, V2, V4, V6 = v_level(1), v_level(2), v_level(4), v_level(6)
for _n in range(1, MAX_VERBOSITY):
    logging.addLevelName(v_level(_n), f"V{_n}")

_LEVEL_LETTER = {logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "F"}


class KlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        letter = _LEVEL_LETTER.get(record.levelno, "I")
        line = (f"{letter}{stamp}.{micros:06d} {os.getpid():7d} "
                f"{record.filename}:{record.lineno}] {record.getMessage()}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(verbosity: int = 0) -> None:
    """Send every record to stderr (klog's logtostderr) down to ``V(verbosity)``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(v_level(min(max(verbosity, 0), MAX_VERBOSITY)))
    # The cloud SDKs' debug output holds signed request headers (the access key ID).
    for sdk in ("botocore", "boto3", "urllib3", "tencentcloud_sdk_common", "google.auth"):
        logging.getLogger(sdk).setLevel(logging.WARNING)
