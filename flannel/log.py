"""Logging in klog's line format (``I1121 15:04:19.123456   4242 file.py:42] message``).

Owns the root logger's handler and level. Must not touch: anything else.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
                 logging.ERROR: "E", logging.CRITICAL: "F"}


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
    """Send every record to stderr (klog's logtostderr); ``-v`` >= 1 adds debug records."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    # gRPC is chatty at INFO; its warnings still come through.
    logging.getLogger("grpc").setLevel(logging.WARNING)
    # The cloud SDKs' debug output holds signed request headers (the access key ID).
    for sdk in ("botocore", "boto3", "urllib3", "tencentcloud_sdk_common"):
        logging.getLogger(sdk).setLevel(logging.WARNING)
