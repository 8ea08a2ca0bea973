"""``flanneld``'s entry point: parse the command line (``flannel.flags``), answer
``--version`` or a usage error, and hand over to ``flannel.daemon``.

Must not touch: the store, the kernel (``flannel.daemon`` owns both).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from flannel.flags import UsageError, parse_args
from flannel.version import __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"flanneld: {err}", file=sys.stderr)
        print("Run 'flanneld --help' for the list of flags.", file=sys.stderr)
        return 2
    if args.version:
        print(__version__, file=sys.stderr)
        return 0
    from flannel import daemon

    return daemon.main(args)


if __name__ == "__main__":
    sys.exit(main())
