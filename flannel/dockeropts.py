"""``mk-docker-opts``: turn subnet.env into Docker daemon options (upstream mk-docker-opts.sh).

Owns the option letters (-f -d -i -c -m -k), the output format and exit codes of the upstream
script. Reads subnet.env as data (never through a shell). Must not touch: files other than
the output file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from flannel.fileutil import write_atomic
from flannel.subnet.envfile import parse_dotenv

USAGE = ("Usage: mk-docker-opts [-f FLANNEL-ENV-FILE] [-d DOCKER-ENV-FILE] [-i] [-c] [-m] "
         "[-k COMBINED-KEY]\n\n"
         "Generate Docker daemon options based on flannel env file\n"
         "OPTIONS:\n"
         "\t-f\tPath to flannel env file. Defaults to /run/flannel/subnet.env\n"
         "\t-d\tPath to Docker env file to write to. Defaults to /run/docker_opts.env\n"
         "\t-i\tOutput each Docker option as individual var. e.g. DOCKER_OPT_MTU=1500\n"
         "\t-c\tOutput combined Docker options into DOCKER_OPTS var\n"
         "\t-k\tSet the combined options key to this value (default DOCKER_OPTS=)\n"
         "\t-m\tDo not output --ip-masq (useful for older Docker version)\n")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"mk-docker-opts: {message}\n{USAGE}", file=sys.stderr, end="")
        sys.exit(1)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mk-docker-opts", add_help=False)
    parser.add_argument("-f", dest="flannel_env", default="/run/flannel/subnet.env")
    parser.add_argument("-d", dest="docker_env", default="/run/docker_opts.env")
    parser.add_argument("-i", dest="individual", action="store_true")
    parser.add_argument("-c", dest="combined", action="store_true")
    parser.add_argument("-m", dest="no_ipmasq", action="store_true")
    parser.add_argument("-k", dest="key", default="DOCKER_OPTS")
    parser.add_argument("-h", "-?", dest="help", action="store_true")
    return parser


def render(values: dict[str, str], *, individual: bool, combined: bool, no_ipmasq: bool,
           key: str, existing: str) -> str:
    """The docker env file text; ValueError for a bad FLANNEL_IPMASQ."""
    options: dict[str, str] = {}
    if values.get("FLANNEL_SUBNET"):
        options["DOCKER_OPT_BIP"] = f"--bip={values['FLANNEL_SUBNET']}"
    if not no_ipmasq:
        masq = values.get("FLANNEL_IPMASQ", "")
        if masq not in ("true", "false"):
            raise ValueError(f"Invalid value of FLANNEL_IPMASQ: {masq}")
        # Docker must not masquerade when flannel does, and must when it does not.
        options["DOCKER_OPT_IPMASQ"] = f"--ip-masq={'false' if masq == 'true' else 'true'}"
    if values.get("FLANNEL_MTU"):
        options["DOCKER_OPT_MTU"] = f"--mtu={values['FLANNEL_MTU']}"
    if not individual and not combined:
        individual = combined = True
    lines = []
    if individual:
        lines += [f'{name}="{value}"' for name, value in sorted(options.items())]
    if combined:
        joined = existing + "".join(f" {value}" for _, value in sorted(options.items()))
        lines.append(f'{key}="{joined}"')
    return "".join(f"{line}\n" for line in lines)


def subnet_already_routed(subnet: str) -> bool:
    """Whether the routing table already routes the subnet's network via a gateway."""
    result = subprocess.run(["ip", "route", "show", subnet], capture_output=True, text=True,
                            check=False, timeout=10)
    return result.returncode == 0 and " via " in f" {result.stdout}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.help:
        print(USAGE, file=sys.stderr, end="")
        return 1
    try:
        values = parse_dotenv(Path(args.flannel_env).read_text())
    except OSError as err:
        print(f"mk-docker-opts: cannot read {args.flannel_env}: {err.strerror}",
              file=sys.stderr)
        return 1
    try:
        text = render(values, individual=args.individual, combined=args.combined,
                      no_ipmasq=args.no_ipmasq, key=args.key,
                      existing=os.environ.get(args.key, ""))
    except ValueError as err:
        print(err, file=sys.stderr)
        return 1
    write_atomic(args.docker_env, text.encode(), mode=0o644)
    subnet = values.get("FLANNEL_SUBNET", "")
    if subnet:
        address, _, plen = subnet.partition("/")
        octets = address.split(".")
        if len(octets) == 4 and octets[3].isdigit():
            network = f"{'.'.join(octets[:3])}.{int(octets[3]) - 1}/{plen}"
            if subnet_already_routed(network):
                print(f"Your routing table already contains the subnet: {network}",
                      file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
