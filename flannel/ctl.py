"""``flannelctl``: operator commands around flanneld.

Owns the command line of the operator tool: ``install-cni``, ``cleanup`` (whose inventory
of flannel's objects lives in ``flannel/ops/cleanup.py``, imported only for that command), and the
wiring of ``leases``, ``doctor``, ``check``, ``bundle`` and ``status`` (in ``flannel/ops/``):
their typed options (``flannel.ops.options``) are built here once, store flags resolved.
Must not touch: kernel state outside ``cleanup``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flannel.cni.install import LIBRARY_DIR, InstallError, install_conflist, install_plugin
from flannel.flags import UsageError
from flannel.ops import options, parsers
from flannel.ops.storeflags import quiet_store_logs
from flannel.process import stopping

OpsOptions = (options.LeasesOptions | options.DoctorOptions | options.CheckOptions
              | options.BundleOptions | options.StatusOptions)

DEFAULT_HOST_PYTHON = "/usr/bin/python3"


def cmd_install_cni(args: argparse.Namespace) -> int:
    if args.plugin == "none" and (args.python is not None or args.force):
        print("flannelctl install-cni: --python and --force apply to --plugin python only",
              file=sys.stderr)
        return 2
    try:
        installed = []
        if args.plugin == "python":
            python = args.python or DEFAULT_HOST_PYTHON
            target = install_plugin(args.bin_dir, python, force=args.force)
            installed.append(f"{target} (run by {python})")
        installed.append(str(install_conflist(args.conf_dir, args.conflist)))
    except (InstallError, OSError) as err:
        print(f"flannelctl install-cni: {err}", file=sys.stderr)
        return 1
    print(f"installed {' and '.join(installed)}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from flannel.ops import cleanup

    refusal = cleanup.check_not_running(args.force)
    if refusal:
        print(f"flannelctl cleanup: {refusal}", file=sys.stderr)
        return 1
    # In a named namespace (a lab node), the default places hold the host's files.
    named = cleanup.in_named_netns()
    run_files = not (named and cleanup.same_place(args.run_dir, Path("/run")))
    skipped = [what for what, skip in (
        (f"the files under {args.run_dir}", not run_files),
        ("the default CNI directories", named and not (args.cni_bin_dir and args.cni_conf_dir)))
        if skip]
    if skipped:
        print(f"not looked at: {' and '.join(skipped)}, which are the host's: this network "
              "namespace is not (give this node's --run-dir, --subnet-file, --cni-bin-dir, "
              "--cni-conf-dir to include its files)")
    try:
        found = cleanup.inventory(
            args.subnet_file or (args.run_dir / "flannel" / "subnet.env" if run_files
                                 else None),
            args.cni_bin_dir or ([] if named else [Path("/opt/cni/bin")]),
            args.cni_conf_dir or ([] if named else [Path("/etc/cni/net.d")]),
            args.run_dir, args.wireguard_key_file, run_files=run_files)
    except OSError as err:
        print(f"flannelctl cleanup: cannot read this node's state: {err}", file=sys.stderr)
        return 1
    try:
        for kept in found.kept:
            print(f"kept (not flannel's): {kept}")
        if not found.items:
            print("nothing of flannel's found")
            return 0
        if args.dry_run:
            for item in found.items:
                print(f"would remove: {item.what}")
            print(f"{len(found.items)} object(s) would be removed (dry run: nothing changed)")
            return 0
        failures = cleanup.remove(found)
        failed = {id(item) for item, _ in failures}
        for item in found.items:
            if id(item) not in failed:
                print(f"removed: {item.what}")
        for item, reason in failures:
            print(f"flannelctl cleanup: could not remove {item.what}: {reason}",
                  file=sys.stderr)
        return 1 if failures else 0
    finally:
        found.close()


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
                    "cannot run the plugin. A 'flannel' in --bin-dir that is not pyflannel's "
                    "launcher (upstream's static plugin) is never replaced without --force. "
                    "--plugin none installs only the conflist, for "
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
    install.add_argument("--force", action="store_true",
                         help="replace a 'flannel' plugin that pyflannel did not install "
                              "(such as upstream's static one) with the Python plugin")
    install.add_argument("--conflist", type=Path, default=None,
                         help="network config list to install (default: the cbr0 one of the "
                              "upstream manifest)")
    install.set_defaults(func=cmd_install_cni)
    clean = sub.add_parser("cleanup", help="remove everything flannel created on this node")
    clean.add_argument("--dry-run", action="store_true",
                       help="list every object that would be removed, remove nothing")
    clean.add_argument("--force", action="store_true",
                       help="clean up even while flanneld runs in this network namespace")
    clean.add_argument("--subnet-file", type=Path, default=None,
                       help="the subnet.env flanneld wrote (default "
                            "RUN_DIR/flannel/subnet.env)")
    clean.add_argument("--run-dir", type=Path, default=Path("/run"),
                       help="the node's /run, where the backends' helper programs keep their "
                            "sockets and logs and flanneld its files (flannel/); e.g. "
                            "/host/run from a pod (default %(default)s)")
    clean.add_argument("--wireguard-key-file", type=Path, default=None,
                       help="the WireGuard private key flanneld created (its "
                            "WIREGUARD_KEY_FILE; default RUN_DIR/flannel/wgkey); removed only "
                            "when it holds a key")
    clean.add_argument("--cni-bin-dir", type=Path, action="append",
                       help="CNI plugin directory; repeat for several (default /opt/cni/bin)")
    clean.add_argument("--cni-conf-dir", type=Path, action="append",
                       help="CNI config directory; repeat for several (default /etc/cni/net.d)")
    clean.set_defaults(func=cmd_cleanup)
    parsers.add_leases(sub)
    parsers.add_doctor(sub)
    parsers.add_check(sub)
    parsers.add_bundle(sub)
    parsers.add_status(sub)
    return parser


def ops_options(args: argparse.Namespace, environ: dict[str, str] | None = None
                ) -> OpsOptions:
    """The typed options of an operator command, its store flags resolved once for all
    of them (``flannel.ops.locate``: command line > ``FLANNELD_*`` > the flanneld running
    here > flanneld's default); UsageError names a bad value, or what to give when the
    store of ``check`` or ``leases`` would only be a guess."""
    environ = dict(os.environ if environ is None else environ)
    command = args.command
    if command == "status":
        return options.StatusOptions(args.health_url, args.socket, args.subnet_file,
                                     args.timeout, args.json)
    if command == "check" and args.lab:
        return options.CheckOptions(None, args.json, args.count, args.interval, args.timeout,
                                    args.parallel, args.deadline, args.lab, args.lab_root,
                                    max_age=args.max_age)
    from flannel.ops.locate import locate

    located = locate(args, environ)
    if command in ("leases", "check") and located.guessed:
        raise UsageError(located.refusal())
    if command == "leases":
        action = args.leases_command
        return options.LeasesOptions(
            located.store, action, json=getattr(args, "json", False),
            target=args.subnet if action in ("show", "release") else "",
            reserve=args.subnet if action == "reserve" else None,
            reserve_for=getattr(args, "reserve_for", None), yes=getattr(args, "yes", False),
            source=located.source())
    if command == "check":
        return options.CheckOptions(
            located.store, args.json, args.count, args.interval, args.timeout,
            args.parallel, args.deadline, source=located.source(), found=located.found,
            max_age=args.max_age)
    cni = (tuple(args.cni_bin_dir or options.DEFAULT_CNI_BIN_DIRS),
           tuple(args.cni_conf_dir or options.DEFAULT_CNI_CONF_DIRS))
    if command == "bundle":
        return options.BundleOptions(located.store, args.output, args.health_url,
                                     tuple(args.log_file or ()), args.journal, *cni,
                                     found=located.found, source=located.source(),
                                     note=located.note if located.guessed else "")
    return options.DoctorOptions(located.store, args.json, *cni, args.probe_timeout,
                                 args.fix_checksum_offload, located.found, located.note,
                                 located.given, args.max_age)


def run(args: argparse.Namespace) -> int:
    """The command ``args`` names, its options typed first (exit 2 for a bad one)."""
    if args.command in ("install-cni", "cleanup"):
        return int(args.func(args))
    try:
        typed = ops_options(args)
    except UsageError as err:
        print(f"flannelctl {args.command}: {err}", file=sys.stderr)
        return 2
    if args.command != "status":
        quiet_store_logs()
    return int(args.func(typed))


def main(argv: list[str] | None = None) -> int:
    parsed: list[argparse.Namespace] = []

    def command() -> int:
        parsed.append(build_parser().parse_args(argv))
        return run(parsed[0])

    return stopping.run(lambda: " ".join(["flannelctl", *(a.command for a in parsed)]),
                        command)


if __name__ == "__main__":
    sys.exit(main())
