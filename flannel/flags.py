"""``flanneld``'s flags: Go ``flag`` syntax, ``FLANNELD_*`` environment fallbacks.

Owns the flag table (names, types, defaults of upstream's ``main.go``), the precedence
command line > environment > default, the checks that can be made before anything starts,
and turns the result into the frozen ``flannel.settings.Settings``. Unlike Go flannel, an
unknown flag or a bad value (on the command line or in the environment) exits non-zero with
a message naming it. The command line is read by this module's own scanner, in argparse's
terms and messages (``argument -x/--x: ...``, ``unrecognized arguments: ...``); argparse is
loaded only to print ``--help``: with what it loads (gettext, shutil with bz2 and lzma) it
would be ~1.5 MiB of every flanneld's memory for life.
Shared by ``flannel.cli`` (flanneld's entry point) and ``flannel.ops`` (which reads the store
flags of flannelctl commands and of a running flanneld's command line with this parser).
Must not touch: the store, the kernel, the daemon.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from flannel.settings import (
    DataplaneSettings,
    EtcdSettings,
    FileSettings,
    HealthSettings,
    InterfaceSettings,
    KubeSettings,
    LogSettings,
    OptionSource,
    ProbeSettings,
    RulesSettings,
    Settings,
    StoreSettings,
)

if TYPE_CHECKING:
    import argparse

#: Parsed flags: what ``parse_namespace`` gives, or a flannelctl command's own argparse result.
Namespace: TypeAlias = "argparse.Namespace | SimpleNamespace"

_UNSET = object()


class UsageError(Exception):
    """A flag or environment value is invalid; the message names it."""


def parse_go_bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"{text!r} is not a boolean (use true or false)")


def parse_go_int(text: str) -> int:
    """Go's flag int: decimal, or 0x/0o/0b prefixed."""
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not an integer") from None


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def parse_go_duration(text: str) -> float:
    """Go's time.ParseDuration (``24h``, ``1h30m``, ``90s``), in seconds."""
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ValueError(f"{text!r} is not a duration such as 24h, 90m or 3600s")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not text:
        raise ValueError("empty duration")
    return total


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # "str", "int", "bool", "list", "duration"
    default: Any
    help: str

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_").replace(".", "_")

    @property
    def env_name(self) -> str:
        return "FLANNELD_" + self.name.upper().replace("-", "_").replace(".", "_")

    def convert(self, text: str) -> Any:
        converters: dict[str, Callable[[str], Any]] = {
            "str": str, "list": str, "int": parse_go_int, "bool": parse_go_bool,
            "duration": parse_go_duration,
        }
        return converters[self.kind](text)


FLAGS: tuple[Flag, ...] = (
    Flag("etcd-endpoints", "str", "http://127.0.0.1:4001,http://127.0.0.1:2379",
         "a comma-delimited list of etcd endpoints"),
    Flag("etcd-prefix", "str", "/coreos.com/network", "etcd prefix"),
    Flag("etcd-keyfile", "str", "", "SSL key file used to secure etcd communication"),
    Flag("etcd-certfile", "str", "", "SSL certification file used to secure etcd communication"),
    Flag("etcd-cafile", "str", "", "SSL Certificate Authority file used to secure etcd "
         "communication"),
    Flag("etcd-username", "str", "", "username for BasicAuth to etcd"),
    Flag("etcd-password", "str", "", "password for BasicAuth to etcd"),
    Flag("iface", "list", (), "interface to use (IP or name) for inter-host communication; "
         "can be specified multiple times to check each option in order"),
    Flag("iface-regex", "list", (), "regex expression to match the first interface to use "
         "(IP or name); can be specified multiple times, checked in order after --iface"),
    Flag("iface-can-reach", "str", "", "detect the interface to use from the route to this IP"),
    Flag("subnet-file", "str", "/run/flannel/subnet.env", "filename where env variables "
         "(subnet, MTU, ...) will be written to"),
    Flag("public-ip", "str", "", "IP accessible by other nodes for inter-host communication"),
    Flag("public-ipv6", "str", "", "IPv6 accessible by other nodes for inter-host "
         "communication"),
    Flag("subnet-lease-renew-margin", "int", 60, "subnet lease renewal margin, in minutes, "
         "ranging from 1 to 1439"),
    Flag("subnet-lease-ttl", "duration", 24 * 3600.0, "TTL of the subnet lease in etcd "
         "(Go duration in whole seconds, longer than the renew margin, at most 9000000000s; "
         "pyflannel extension, upstream fixes it at 24h)"),
    Flag("ip-masq", "bool", False, "setup IP masquerade rule for traffic destined outside of "
         "overlay network"),
    Flag("ip-masq-fully-random-disable", "bool", False, "disable --random-fully in the "
         "masquerade rules"),
    Flag("kube-subnet-mgr", "bool", False, "contact the Kubernetes API for subnet assignment "
         "instead of etcd"),
    Flag("kube-api-url", "str", "", "Kubernetes API server URL. Does not need to be specified "
         "if flannel is running in a pod"),
    Flag("kube-annotation-prefix", "str", "flannel.alpha.coreos.com", "Kubernetes annotation "
         "prefix. Can contain single slash \"/\", otherwise it will be appended at the end"),
    Flag("kubeconfig-file", "str", "", "kubeconfig file location. Does not need to be "
         "specified if flannel is running in a pod"),
    Flag("version", "bool", False, "print version and exit"),
    Flag("healthz-ip", "str", "0.0.0.0", "the IP address for healthz server to listen; the "
         "default answers /healthz and /readyz on every address of the host, give "
         "127.0.0.1 or a private address to limit who can read them"),
    Flag("healthz-port", "int", 0, "the port for healthz server to listen, 1 to 65535 "
         "(0 to disable)"),
    Flag("reconcile-interval", "int", 30, "period of the full kernel state resync, in seconds "
         "from 1 to 86400 (netlink events trigger repairs sooner; pyflannel extension)"),
    Flag("peer-probe-interval", "int", 30, "seconds between two probes of each peer over the "
         "overlay, from 0 (no probes) to 3600; stretched so that no more than "
         "--peer-probe-rate probes leave a second (unreachable peers and why in /status, "
         "/metrics and the log; pyflannel extension)"),
    Flag("peer-probe-rate", "int", 20, "probes a second at most, to all peers together, from "
         "1 to 1000 (pyflannel extension)"),
    Flag("peer-probe-metrics-per-peer", "bool", False, "a /metrics series per peer (its "
         "reachability and round trip), for small clusters: at most the first 256 peers "
         "(pyflannel extension)"),
    Flag("peer-probe-readiness", "bool", False, "not ready while a peer is unreachable over "
         "the overlay (by default readiness says only whether this node's own data plane is "
         "programmed; pyflannel extension)"),
    Flag("iptables-resync", "int", 5, "resync period for iptables rules, in seconds from 1 "
         "to 86400"),
    Flag("iptables-mode", "str", "auto", "iptables backend for the rules: auto (the one "
         "holding kubelet/kube-proxy chains, else the one with more rules, else nft), legacy "
         "or nft (pyflannel extension)"),
    Flag("iptables-forward-rules", "bool", True, "add default accept rules to FORWARD chain "
         "in iptables"),
    Flag("encap-peers-only", "bool", False, "accept the packets of the backend's unauthenticated "
         "encapsulation (vxlan's, udp's) only from the public IP of a lease (an input filter "
         "and the backend's own receiver drop the rest); "
         "every node must send from the public IP it publishes: no --public-ip or "
         "public-ip-overwrite naming another address, no NAT between nodes (pyflannel "
         "extension)"),
    Flag("drop-pod-encap", "bool", True, "drop packets that pods send to the backend's "
         "encapsulation ports and protocols (as its carriers declare them), "
         "on this node and on their way out of the pod network, before masquerade would "
         "make them look like a peer's (pyflannel extension)"),
    Flag("ip-blackhole-route", "bool", False, "keep a blackhole route for the local pod "
         "subnet(s)"),
    Flag("net-config-path", "str", "/etc/kube-flannel/net-conf.json", "path to the network "
         "configuration file (kube mode)"),
    Flag("set-node-network-unavailable", "bool", True, "set NetworkUnavailable=False on the "
         "node when ready (kube mode)"),
    Flag("v", "int", 0, "log level for V logs (klog's: any 32-bit number is taken; 0 info, "
         "1 pass and check reasons, 2 per peer, 4 kernel changes, 6 rule payloads, 10 and "
         "above everything)"),
    Flag("vmodule", "str", "", "comma-separated list of pattern=N settings for file-filtered "
         "logging (accepted for compatibility)"),
    Flag("log_backtrace_at", "str", "", "when logging hits line file:N, emit a stack trace "
         "(accepted for compatibility)"),
)


#: etcd's MaxLeaseTTL (lessor): the longest lease, in seconds, a LeaseGrant is given.
ETCD_MAX_LEASE_TTL = 9_000_000_000

#: Integer flags and the values that make sense: (lowest, highest, what to give).
_INT_RANGES: dict[str, tuple[int, int, str]] = {
    "subnet-lease-renew-margin": (1, 1439, "minutes from {} to {}"),
    "healthz-port": (0, 65535, "a port from {} to {} (0 turns the health server off)"),
    "reconcile-interval": (1, 86400, "seconds from {} to {}"),
    "iptables-resync": (1, 86400, "seconds from {} to {}"),
    "peer-probe-interval": (0, 3600, "seconds from {} (no probes) to {}"),
    "peer-probe-rate": (1, 1000, "probes a second from {} to {}"),
    # klog's Level is an int32; below 0 logs as 0, above 10 as 10.
    "v": (-2**31, 2**31 - 1, "a log level from {} to {}"),
}


def _flag_value(name: str, value: object, from_env: set[str]) -> str:
    """``--name=value``, saying when the value came from the environment."""
    dashes = "-" if len(name) == 1 else "--"
    source = ""
    if name in from_env:
        source = " (from FLANNELD_" + name.upper().replace("-", "_") + ")"
    return f"{dashes}{name}={value}{source}"


_GIVE_NODE_ADDRESS = "give this node's address on the network between the nodes"


def _unusable_address(text: str, version: int) -> str | None:
    """Why ``text`` cannot be published as this node's address (and the fix), or None."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return f"not an IPv{version} address; {_GIVE_NODE_ADDRESS}"
    if addr.version != version:
        return (f"an IPv{addr.version} address; give it with "
                f"{'--public-ipv6' if version == 4 else '--public-ip'}")
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return "an IPv4-mapped address; give the IPv4 address with --public-ip"
    for kind, bad in (("the unspecified address", addr.is_unspecified),
                      ("a loopback address", addr.is_loopback),
                      ("a multicast address", addr.is_multicast),
                      ("a link-local address", addr.is_link_local),
                      ("the broadcast address", text == "255.255.255.255"),
                      ("an address with a zone index", "%" in text)):
        if bad:
            return f"{kind}, which other nodes cannot reach; {_GIVE_NODE_ADDRESS}"
    return None


def check_values(args: Namespace, from_env: set[str]) -> None:
    """Refuse values that would hurt once running; each message names the flag and the fix."""
    for name, (low, high, unit) in _INT_RANGES.items():
        value = getattr(args, name.replace("-", "_"))
        if not low <= value <= high:
            raise UsageError(f"{_flag_value(name, value, from_env)}: out of acceptable range; "
                             f"give {unit.format(low, high)}")
    ttl = args.subnet_lease_ttl
    shown = _flag_value("subnet-lease-ttl", f"{ttl:.15g}s", from_env)
    if not ttl <= ETCD_MAX_LEASE_TTL:  # also catches inf and nan
        raise UsageError(f"{shown}: longer than etcd allows; give at most "
                         f"{ETCD_MAX_LEASE_TTL}s")
    if ttl != int(ttl):
        raise UsageError(f"{shown}: etcd leases last whole seconds; give a whole number of "
                         "seconds, such as 24h or 90000s")
    margin = args.subnet_lease_renew_margin
    if ttl <= margin * 60:
        raise UsageError(
            f"{shown}: must be longer than --subnet-lease-renew-margin ({margin} min), or "
            "the lease would be renewed continuously")
    for name, version in (("public-ip", 4), ("public-ipv6", 6)):
        text = getattr(args, name.replace("-", "_"))
        why = _unusable_address(text, version) if text else None
        if why:
            raise UsageError(f"{_flag_value(name, text, from_env)}: {why}")
    if args.iptables_mode not in ("auto", "legacy", "nft"):
        raise UsageError(f"{_flag_value('iptables-mode', args.iptables_mode, from_env)}: "
                         "not one of auto, legacy, nft")
    try:
        ipaddress.ip_address(args.healthz_ip)
    except ValueError:
        raise UsageError(
            f"{_flag_value('healthz-ip', args.healthz_ip, from_env)}: not an IP address; "
            "give the address to listen on, such as 127.0.0.1, or 0.0.0.0 for every "
            "address") from None


DESCRIPTION = """\
flanneld runs on every host of a flannel network. It leases a subnet for the host's pods
from etcd v3 (the default) or from the Kubernetes API (--kube-subnet-mgr), writes it to
--subnet-file for the CNI plugin, and programs the kernel so that pods on every host reach
each other with the backend the network config names (Backend.Type, e.g. vxlan).
It needs root, or CAP_NET_ADMIN and CAP_NET_RAW.

Flags take Go's syntax: -iface=eth0, --iface eth0, --ip-masq, --ip-masq=false. A flag not
given falls back to its FLANNELD_* environment variable, then to its default."""


def _help_text(flag: Flag) -> str:
    """The flag's help with its default and variable (argparse formats it: % doubled)."""
    default = "" if flag.name == "version" else shown_value(flag, flag.default)
    shown = f"default {default or 'none'}; " if flag.name != "version" else ""
    return f"{flag.help} ({shown}env {flag.env_name})".replace("%", "%%")


_METAVARS = {"bool": "BOOL", "int": "N", "duration": "DURATION", "str": "VALUE",
             "list": "VALUE"}


def _print_help() -> NoReturn:
    """Print the flags' help as argparse formats it, and exit 0."""
    import argparse  # only here: see the module's docstring

    parser = argparse.ArgumentParser(
        prog="flanneld", usage="%(prog)s [OPTION]...", allow_abbrev=False,
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False)
    # Go's flag package takes -help as well as -h and --help.
    parser.add_argument(*_HELP, action="help", help="show this help message and exit")
    for flag in FLAGS:
        names = [f"-{flag.name}", f"--{flag.name}"]
        common: dict[str, Any] = {"dest": flag.dest, "help": _help_text(flag),
                                  "metavar": _METAVARS[flag.kind]}
        if flag.kind == "bool":
            parser.add_argument(*names, nargs="?", **common)
        elif flag.kind == "list":
            parser.add_argument(*names, action="append", **common)
        else:
            parser.add_argument(*names, **common)
    parser.print_help()
    raise SystemExit(0)


_HELP = ("-h", "-help", "--help")
#: Every spelling of every flag: -name and --name.
_BY_OPTION = {f"{dashes}{flag.name}": flag for flag in FLAGS for dashes in ("-", "--")}
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _takes_value(arg: str) -> bool:
    """Whether ``arg``, following a flag, is that flag's value rather than another flag (as
    argparse decides: ``-`` alone, a negative number or words with a space are values)."""
    if not arg.startswith("-") or arg == "-" or _NEGATIVE_NUMBER.match(arg):
        return True
    return " " in arg and arg.partition("=")[0] not in _BY_OPTION


def _scan(argv: Sequence[str]) -> SimpleNamespace:
    """The flags given on the command line, Go's syntax (``-name`` or ``--name``, its value
    after ``=`` or as the next argument; a bool alone is true), each flag not given left
    ``_UNSET`` (a list: None)."""
    args = SimpleNamespace(**{flag.dest: None if flag.kind == "list" else _UNSET
                              for flag in FLAGS})
    unrecognized: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "--":
            unrecognized.extend(argv[index - 1:])
            break
        if arg in _HELP:
            _print_help()
        option, equals, attached = arg.partition("=")
        flag = _BY_OPTION.get(option) if arg.startswith("-") else None
        if flag is None:
            unrecognized.append(arg)
            continue
        if equals:
            text = attached
        elif index < len(argv) and _takes_value(argv[index]):
            text = argv[index]
            index += 1
        elif flag.kind == "bool":
            text = "true"
        else:
            raise UsageError(f"argument -{flag.name}/--{flag.name}: expected one argument")
        try:
            value = flag.convert(text)
        except ValueError as err:
            raise UsageError(f"argument -{flag.name}/--{flag.name}: {err}") from None
        if flag.kind == "list":
            setattr(args, flag.dest, [*(getattr(args, flag.dest) or ()), value])
        else:
            setattr(args, flag.dest, value)
    if unrecognized:
        raise UsageError(f"unrecognized arguments: {' '.join(unrecognized)}")
    return args


def store_settings(args: Namespace) -> StoreSettings:
    """The store part of checked flags (also used by flannelctl's store commands)."""
    if args.kube_subnet_mgr:
        return KubeSettings(
            api_url=args.kube_api_url, kubeconfig_file=args.kubeconfig_file,
            annotation_prefix=args.kube_annotation_prefix,
            net_config_path=args.net_config_path,
            set_node_network_unavailable=args.set_node_network_unavailable)
    return EtcdSettings(
        endpoints=args.etcd_endpoints, prefix=args.etcd_prefix, keyfile=args.etcd_keyfile,
        certfile=args.etcd_certfile, cafile=args.etcd_cafile, username=args.etcd_username,
        password=args.etcd_password, lease_ttl=int(args.subnet_lease_ttl),
        renew_margin=args.subnet_lease_renew_margin * 60,
        previous_subnet_file=args.subnet_file)


#: Flags whose value is never shown.
_SECRET_FLAGS = frozenset({"etcd-password"})
#: Flags holding URLs, whose user information (``user:password@``) is masked.
_URL_FLAGS = frozenset({"etcd-endpoints", "kube-api-url"})
_MASK = "*****"


def _go_duration(seconds: float) -> str:
    """Go's Duration.String of whole seconds: ``24h0m0s``, ``1m30s``, ``45s``."""
    whole = int(seconds)
    if whole != seconds or whole <= 0:
        return f"{seconds:.15g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _masked_url(text: str) -> str:
    """``text`` (a URL, or a comma-separated list of them) with the password, or a user
    part that may be a token, masked: ``user:*****@host``, ``*****@host``."""
    items = []
    for item in text.split(","):
        scheme, sep, rest = item.partition("://")
        userinfo, at, host = rest.partition("@") if sep else ("", "", "")
        if at:
            user, colon, _password = userinfo.partition(":")
            item = f"{scheme}://{user + ':' if colon else ''}{_MASK}@{host}"
        items.append(item)
    return ",".join(items)


def shown_value(flag: Flag, value: Any) -> str:
    """A flag's value as the start-up line shows it, secrets masked."""
    if flag.name in _SECRET_FLAGS:
        return _MASK if value else ""
    if flag.kind == "bool":
        return "true" if value else "false"
    if flag.kind == "list":
        return ",".join(value)
    if flag.kind == "duration":
        return _go_duration(value)
    if flag.name in _URL_FLAGS:
        return _masked_url(str(value))
    return str(value)


def effective_options(args: Namespace) -> tuple[OptionSource, ...]:
    """Every flag's effective value and its source, as ``parse_namespace`` recorded them."""
    sources: dict[str, str] = getattr(args, "sources", {})
    return tuple(OptionSource(flag.name, shown_value(flag, getattr(args, flag.dest)),
                              sources.get(flag.name, "default"), flag.name in _SECRET_FLAGS)
                 for flag in FLAGS if flag.name != "version")


def unknown_environment(environ: dict[str, str]) -> tuple[str, ...]:
    """A warning for each ``FLANNELD_*`` variable that is no flag's, naming the nearest
    one: Go flannel ignores them, and a misspelt variable silently means the default."""
    prefix = "FLANNELD_"
    known = [flag.env_name for flag in FLAGS]
    warnings = []
    for name in sorted(environ):
        if not name.startswith(prefix) or name in known:
            continue
        # Compared without the prefix every name shares, which would make all look alike.
        import difflib  # only for a misspelt variable: not held by every flanneld

        nearest = difflib.get_close_matches(name.removeprefix(prefix),
                                            [k.removeprefix(prefix) for k in known], n=1,
                                            cutoff=0.6)
        advice = (f"did you mean {prefix}{nearest[0]}?" if nearest else
                  "every flag's variable is FLANNELD_ and its name in capitals, with _ for "
                  "- (--etcd-endpoints is FLANNELD_ETCD_ENDPOINTS)")
        warnings.append(f"environment variable {name[:80]} is no flag's and is ignored; "
                        f"{advice}")
    return tuple(warnings)


def settings_from(args: Namespace) -> Settings:
    """The typed settings of checked flags."""
    return Settings(
        store=store_settings(args),
        interface=InterfaceSettings(
            ifaces=tuple(args.iface), iface_regexes=tuple(args.iface_regex),
            can_reach=args.iface_can_reach, public_ip=args.public_ip,
            public_ipv6=args.public_ipv6),
        rules=RulesSettings(
            ip_masq=args.ip_masq, fully_random_disable=args.ip_masq_fully_random_disable,
            forward=args.iptables_forward_rules, resync=args.iptables_resync,
            iptables_mode=args.iptables_mode, blackhole_route=args.ip_blackhole_route,
            encap_peers_only=args.encap_peers_only, drop_pod_encap=args.drop_pod_encap),
        health=HealthSettings(ip=args.healthz_ip, port=args.healthz_port),
        dataplane=DataplaneSettings(reconcile_interval=args.reconcile_interval),
        probes=ProbeSettings(interval=args.peer_probe_interval, rate=args.peer_probe_rate,
                             per_peer_metrics=args.peer_probe_metrics_per_peer,
                             readiness=args.peer_probe_readiness),
        files=FileSettings(subnet_file=args.subnet_file),
        log=LogSettings(v=args.v, vmodule=args.vmodule, backtrace_at=args.log_backtrace_at),
        version=args.version, options=effective_options(args),
        warnings=getattr(args, "warnings", ()))


def parse_args(argv: Sequence[str], environ: dict[str, str] | None = None) -> Settings:
    """Parse flags, then fill unset ones from ``FLANNELD_*``, then defaults."""
    args = parse_namespace(argv, environ)
    return Settings(version=True) if args.version is True else settings_from(args)


def parse_namespace(argv: Sequence[str], environ: dict[str, str] | None = None
                    ) -> SimpleNamespace:
    """The flags as a namespace, every value filled and checked (``--version`` alone is
    honoured before the environment and the checks)."""
    environ = dict(os.environ if environ is None else environ)
    from_env: set[str] = set()
    args = _scan(argv)
    if args.version is True:
        # Honoured before the environment, as upstream: FLANNELD_VERSION has no effect.
        return args
    sources: dict[str, str] = {}
    for flag in FLAGS:
        value = getattr(args, flag.dest)
        if value is None and flag.kind == "list":
            value = _UNSET
        sources[flag.name] = "flag" if value is not _UNSET else "default"
        if value is _UNSET and flag.name == "version":
            value = False
        elif value is _UNSET:
            env_text = environ.get(flag.env_name, "")
            if env_text:
                try:
                    converted = flag.convert(env_text)
                except ValueError as err:
                    raise UsageError(
                        f"{flag.env_name}={env_text!r}: invalid value for --{flag.name}: {err}"
                    ) from None
                value = [converted] if flag.kind == "list" else converted
                from_env.add(flag.name)
                sources[flag.name] = flag.env_name
            else:
                value = list(flag.default) if flag.kind == "list" else flag.default
        setattr(args, flag.dest, value)
    args.sources = sources
    args.warnings = unknown_environment(environ)
    check_values(args, from_env)
    return args
