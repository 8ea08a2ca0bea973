"""flanneld's settings: frozen, typed, grouped by the part of the daemon that reads them.

Owns the shape of the configuration once the command line and ``FLANNELD_*`` are parsed and
checked (``flannel.flags`` builds it): which store and how to reach it, how the external
interface is chosen, the traffic rules, the health server, the data plane, the files and the
log level. Nothing here parses or validates; every value is already checked.
Must not touch: the store, the kernel, the environment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EtcdSettings:
    """The etcd v3 store (the default)."""

    endpoints: str = "http://127.0.0.1:4001,http://127.0.0.1:2379"
    prefix: str = "/coreos.com/network"
    keyfile: str = ""
    certfile: str = ""
    cafile: str = ""
    username: str = ""
    password: str = ""
    lease_ttl: int = 24 * 3600  # seconds
    renew_margin: int = 3600  # seconds before expiry the lease is renewed
    #: The subnet.env of the previous run, whose subnets are reused when free.
    previous_subnet_file: str = "/run/flannel/subnet.env"


@dataclass(frozen=True)
class KubeSettings:
    """The Kubernetes API store (``--kube-subnet-mgr``)."""

    api_url: str = ""
    kubeconfig_file: str = ""
    annotation_prefix: str = "flannel.alpha.coreos.com"
    net_config_path: str = "/etc/kube-flannel/net-conf.json"
    set_node_network_unavailable: bool = True


StoreSettings = EtcdSettings | KubeSettings


@dataclass(frozen=True)
class InterfaceSettings:
    """How the interface between the nodes is chosen and which addresses are published."""

    ifaces: tuple[str, ...] = ()
    iface_regexes: tuple[str, ...] = ()
    can_reach: str = ""
    public_ip: str = ""
    public_ipv6: str = ""


@dataclass(frozen=True)
class RulesSettings:
    """The traffic rules (masquerade, forward, the encapsulation filter, the drop of
    encapsulation sent by pods) and the blackhole routes."""

    ip_masq: bool = False
    fully_random_disable: bool = False
    forward: bool = True
    resync: int = 5  # seconds
    iptables_mode: str = "auto"
    blackhole_route: bool = False
    #: Encapsulated traffic (vxlan, udp) only from the public addresses of the leases.
    encap_peers_only: bool = False
    #: Packets from the pod network to the backend's encapsulation ports dropped.
    drop_pod_encap: bool = True


@dataclass(frozen=True)
class HealthSettings:
    """The /healthz and /readyz server; ``port`` 0 turns it off."""

    ip: str = "0.0.0.0"
    port: int = 0


@dataclass(frozen=True)
class DataplaneSettings:
    reconcile_interval: int = 30  # seconds between full kernel resyncs


@dataclass(frozen=True)
class FileSettings:
    subnet_file: str = "/run/flannel/subnet.env"


@dataclass(frozen=True)
class LogSettings:
    v: int = 0
    vmodule: str = ""  # accepted for compatibility
    backtrace_at: str = ""  # accepted for compatibility


@dataclass(frozen=True)
class OptionSource:
    """One effective option as logged at start."""

    name: str  # the flag's name, without dashes
    shown: str  # its value as text, secrets masked
    source: str  # "flag", the FLANNELD_* variable it came from, or "default"
    secret: bool = False  # a credential: masked in the log, left out of /status


def options_line(options: tuple[OptionSource, ...]) -> str:
    """The options as one line: ``--name=value (source)`` each."""
    return " ".join(f"{'-' if len(o.name) == 1 else '--'}{o.name}={o.shown} ({o.source})"
                    for o in options)


@dataclass(frozen=True)
class Settings:
    store: StoreSettings = EtcdSettings()
    interface: InterfaceSettings = InterfaceSettings()
    rules: RulesSettings = RulesSettings()
    health: HealthSettings = HealthSettings()
    dataplane: DataplaneSettings = DataplaneSettings()
    files: FileSettings = FileSettings()
    log: LogSettings = LogSettings()
    version: bool = False  # print the version and exit
    #: Every option's effective value and where it came from, in flag order.
    options: tuple[OptionSource, ...] = ()
    #: What flanneld warns about once its log is set up (unknown FLANNELD_* variables).
    warnings: tuple[str, ...] = ()
