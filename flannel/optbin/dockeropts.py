"""``mk-docker-opts``: turn subnet.env into Docker daemon options (upstream mk-docker-opts.sh).

Owns the option letters (-f -d -i -c -m -k), the output format and exit codes of the upstream
script, and what that script sees: the environment overlaid by the flannel env file (which the
script sources), so ``FLANNEL_*``, ``DOCKER_OPT_*`` and the combined key may come from either,
the file winning. A missing flannel env file (or one that is not a regular file) counts as
empty, as upstream's ``[ -f ]`` test does. Reads the file as data (never through a shell),
bounded, and refuses what would not be a Docker option or could not be written inside double
quotes; writes the output atomically (a new temp file, then rename).
Must not touch: files other than the output file and its temp sibling.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import re
import stat
import subprocess
import sys
from collections.abc import Mapping

from flannel.files.fileutil import write_atomic
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


MAX_INPUT = 64 * 1024  # a subnet.env is a few hundred bytes
MAX_VALUE = 4096  # one option, or all of them combined
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPTION_PREFIX = "DOCKER_OPT_"
# Inside the output's double quotes these would end the value or be expanded by the shell
# or systemd that reads the file.
_UNQUOTABLE = re.compile(r'["\\$`\x00-\x1f\x7f]')


class InputError(Exception):
    """The input cannot be used; the message names the file or value and the fix."""


def read_flannel_env(path: str) -> dict[str, str]:
    """The values of the flannel env file at ``path``, read as bounded UTF-8 text; empty when
    there is no regular file there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return {}
        raise InputError(f"cannot read {path}: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return {}
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_INPUT + 1)
        except OSError as err:
            raise InputError(f"cannot read {path}: {err.strerror}") from None
    if len(data) > MAX_INPUT:
        raise InputError(f"cannot read {path}: larger than {MAX_INPUT} bytes; give the "
                         "subnet.env flanneld writes")
    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        raise InputError(f"cannot read {path}: not UTF-8 text (byte 0x{data[err.start]:02x} "
                         f"at offset {err.start}); give the subnet.env flanneld writes"
                         ) from None
    return parse_dotenv(text)


def is_option(name: str) -> bool:
    """Whether a variable is a Docker option: a shell variable named DOCKER_OPT_*."""
    return name.startswith(OPTION_PREFIX) and _KEY.fullmatch(name) is not None


def check(variables: Mapping[str, str], key: str, origin: Mapping[str, str]) -> None:
    """Refuse a value that would not be a Docker option; ``origin`` names where each of
    ``variables`` came from (the flannel env file or the environment)."""
    subnet, mtu = variables.get("FLANNEL_SUBNET", ""), variables.get("FLANNEL_MTU", "")
    if subnet:
        try:
            ipaddress.IPv4Interface(subnet)
        except ValueError:
            raise InputError(f"Invalid value of FLANNEL_SUBNET in {origin['FLANNEL_SUBNET']}: "
                             f"{subnet!r} is not an IPv4 address/prefix such as 10.1.74.1/24"
                             ) from None
    if mtu and not (mtu.isascii() and mtu.isdigit() and len(mtu) <= 6):
        raise InputError(f"Invalid value of FLANNEL_MTU in {origin['FLANNEL_MTU']}: {mtu!r} "
                         "is not a number")
    for name, value in sorted(variables.items()):
        if name != key and not is_option(name):
            continue
        if _UNQUOTABLE.search(value) or len(value) > MAX_VALUE:
            raise InputError(f"Invalid value of {name} in {origin[name]}: {value[:100]!r} "
                             f"cannot be written as a Docker option (at most {MAX_VALUE} "
                             "characters, no quotes, backslashes, '$', '`' or control "
                             "characters); unset it or fix it")


def write_output(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (mode 0644)."""
    try:
        write_atomic(path, text.encode(), mode=0o644)
    except OSError as err:
        raise InputError(f"cannot write {path}: {err.strerror or err}; give -d a file in a "
                         "writable directory") from None


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


def render(variables: Mapping[str, str], *, individual: bool, combined: bool,
           no_ipmasq: bool, key: str) -> str:
    """The docker env file text from the variables the script sees; ValueError for a bad
    FLANNEL_IPMASQ.

    Every ``DOCKER_OPT_*`` variable is an option, in name order, those derived from flannel's
    values replacing any of the same name. The combined value starts with the key's own value
    and a space when that is set, then a space before each option.
    """
    options = {name: value for name, value in variables.items() if is_option(name)}
    if variables.get("FLANNEL_SUBNET"):
        options["DOCKER_OPT_BIP"] = f"--bip={variables['FLANNEL_SUBNET']}"
    if variables.get("FLANNEL_MTU"):
        options["DOCKER_OPT_MTU"] = f"--mtu={variables['FLANNEL_MTU']}"
    masq = variables.get("FLANNEL_IPMASQ", "")
    if masq and not no_ipmasq:
        if masq not in ("true", "false"):
            raise ValueError(f"Invalid value of FLANNEL_IPMASQ: {masq}")
        # Docker must not masquerade when flannel does, and must when it does not.
        options["DOCKER_OPT_IPMASQ"] = f"--ip-masq={'false' if masq == 'true' else 'true'}"
    if not individual and not combined:
        individual = combined = True
    ordered = sorted(options.items())
    lines = []
    if individual:
        lines += [f'{name}="{value}"' for name, value in ordered]
    if combined:
        existing = variables.get(key, "")
        joined = (f"{existing} " if existing else "") + "".join(f" {v}" for _, v in ordered)
        lines.append(f'{key}="{joined}"')
    return "".join(f"{line}\n" for line in lines)


def existing_route(subnet: str) -> str:
    """The routing table's route to the subnet's network via a gateway, or ''."""
    try:
        result = subprocess.run(["ip", "route", "show", subnet], capture_output=True,
                                text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        # As upstream's script: without a usable ip there is no route to complain about.
        return ""
    if result.returncode != 0:
        return ""
    return next((line.strip() for line in result.stdout.splitlines()
                 if " via " in f" {line} "), "")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.help:
        print(USAGE, file=sys.stderr, end="")
        return 1
    if not _KEY.fullmatch(args.key):
        print(f"mk-docker-opts: -k {args.key!r}: not a variable name; use letters, digits "
              "and '_', such as DOCKER_OPTS", file=sys.stderr)
        return 1
    try:
        from_file = read_flannel_env(args.flannel_env)
        variables = {**os.environ, **from_file}
        origin = {name: args.flannel_env if name in from_file else "the environment"
                  for name in variables}
        check(variables, args.key, origin)
        text = render(variables, individual=args.individual, combined=args.combined,
                      no_ipmasq=args.no_ipmasq, key=args.key)
        write_output(args.docker_env, text)
    except InputError as err:
        print(f"mk-docker-opts: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(err, file=sys.stderr)
        return 1
    subnet = variables.get("FLANNEL_SUBNET", "")
    if subnet:
        address, _, plen = subnet.partition("/")
        octets = address.split(".")
        if len(octets) == 4 and octets[3].isdigit():
            network = f"{'.'.join(octets[:3])}.{int(octets[3]) - 1}/{plen}"
            route = existing_route(network)
            if route:
                print(f"Your routing table already contains the subnet: {route}",
                      file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
