"""``flannelctl``: operator commands around flanneld.

Owns the command line of the operator tool. Subcommands so far: ``install-cni``.
Must not touch: kernel state.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flannel.cni.install import InstallError, install_conflist, install_plugin


def cmd_install_cni(args: argparse.Namespace) -> int:
    try:
        plugin = install_plugin(args.bin_dir, args.python)
        conflist = install_conflist(args.conf_dir, args.conflist)
    except (InstallError, OSError) as err:
        print(f"flannelctl install-cni: {err}", file=sys.stderr)
        return 1
    print(f"installed {plugin} and {conflist}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flannelctl",
                                     description="Operator commands around flanneld.")
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install-cni", help="install the CNI plugin and conflist")
    install.add_argument("--bin-dir", type=Path, default=Path("/opt/cni/bin"),
                         help="CNI plugin directory (default %(default)s)")
    install.add_argument("--conf-dir", type=Path, default=Path("/etc/cni/net.d"),
                         help="CNI config directory (default %(default)s)")
    install.add_argument("--python", default=sys.executable,
                         help="Python (>= 3.11) the runtime will run the plugin with, as seen "
                              "from the host (default: this interpreter, %(default)s)")
    install.add_argument("--conflist", type=Path, default=None,
                         help="network config list to install (default: the cbr0 one of the "
                              "upstream manifest)")
    install.set_defaults(func=cmd_install_cni)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
