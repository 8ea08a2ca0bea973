"""``flannelctl``: operator commands around flanneld.

Owns the command line of the operator tool. Subcommands so far: ``install-cni``.
Must not touch: kernel state.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flannel.cni.install import LIBRARY_DIR, InstallError, install_conflist, install_plugin

DEFAULT_HOST_PYTHON = "/usr/bin/python3"


def cmd_install_cni(args: argparse.Namespace) -> int:
    if args.plugin == "none" and args.python is not None:
        print("flannelctl install-cni: --python applies to --plugin python only",
              file=sys.stderr)
        return 2
    try:
        installed = []
        if args.plugin == "python":
            python = args.python or DEFAULT_HOST_PYTHON
            installed.append(f"{install_plugin(args.bin_dir, python)} (run by {python})")
        installed.append(str(install_conflist(args.conf_dir, args.conflist)))
    except (InstallError, OSError) as err:
        print(f"flannelctl install-cni: {err}", file=sys.stderr)
        return 1
    print(f"installed {' and '.join(installed)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flannelctl",
                                     description="Operator commands around flanneld.")
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser(
        "install-cni", help="install the CNI plugin and conflist",
        description="Install the flannel CNI plugin into --bin-dir and the network config list "
                    "into --conf-dir, each replaced atomically. --plugin python (the default) "
                    "installs pyflannel's own plugin: the launcher 'flannel' and its modules "
                    f"under {LIBRARY_DIR}/<version>-<hash>/, which the container runtime runs "
                    "on the host with --python. That interpreter is checked first (CPython >= "
                    "3.9 with _json and _socket) and refused, with nothing written, when it "
                    "cannot run the plugin. --plugin none installs only the conflist, for "
                    "nodes whose 'flannel' executable comes from elsewhere, such as upstream's "
                    "static plugin from its flannel-cni-plugin image.")
    install.add_argument("--bin-dir", type=Path, default=Path("/opt/cni/bin"),
                         help="CNI plugin directory (default %(default)s)")
    install.add_argument("--conf-dir", type=Path, default=Path("/etc/cni/net.d"),
                         help="CNI config directory (default %(default)s)")
    install.add_argument("--plugin", choices=("python", "none"), default="python",
                         help="which flannel plugin to install (default %(default)s)")
    install.add_argument("--python", default=None, metavar="PATH",
                         help="the host's Python that runs the plugin (default "
                              f"{DEFAULT_HOST_PYTHON}: the distribution's own, not pyflannel's "
                              "virtualenv or image, which can move or be upgraded under "
                              "running pods; the plugin needs only the standard library)")
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
