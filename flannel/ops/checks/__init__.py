"""Doctor checks: each a small function from the gathered ``Context`` to findings.

Owns the list of checks and the context they share (subnet.env, network config, leases,
this node's lease, the kernel view). Checks only read; a fix runs only when a flag asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from flannel.backend.footprint import Footprint
from flannel.config import NetworkConfig
from flannel.lease import Lease
from flannel.ops.findings import Finding
from flannel.ops.kernelview import KernelView
from flannel.ops.leases import LeaseRow, vtep_mac


@dataclass
class Context:
    subnet_file: Path
    sysctl_root: Path
    cni_bin_dirs: list[Path]
    cni_conf_dirs: list[Path]
    probe_timeout: float
    fix_checksum: bool
    probe: bool = True
    kube_mode: bool = False  # --kube-subnet-mgr: pods get their network through CNI
    env: dict[str, str] | None = None
    env_error: str = ""
    config: NetworkConfig | None = None
    rows: list[LeaseRow] | None = None  # None: the store could not be read
    store_error: str = ""
    clock_skew: float | None = None
    kernel: KernelView = field(default_factory=KernelView)
    flanneld_pids: list[int] = field(default_factory=list)

    @property
    def leases(self) -> list[Lease]:
        return [row.lease for row in self.rows or [] if row.lease is not None]

    @property
    def own_subnet(self) -> IPv4Network | None:
        text = (self.env or {}).get("FLANNEL_SUBNET", "")
        try:
            return IPv4Network(text, strict=False) if text else None
        except ValueError:
            return None

    @property
    def own_lease(self) -> Lease | None:
        subnet = self.own_subnet
        return next((lease for lease in self.leases if lease.subnet == subnet), None)

    @property
    def peers(self) -> list[Lease]:
        """Other nodes' leases flanneld programs: inside the Network, with a public IP and,
        for a backend reaching peers through a VTEP, a VTEP MAC in its leases."""
        own, network = self.own_subnet, self.config.network if self.config else None
        described = self.described
        needs_mac = described[0] if described is not None and described[1].vtep else None
        return [lease for lease in self.leases if lease.subnet is not None
                and lease.subnet != own and lease.attrs.public_ip is not None
                and (network is None or lease.subnet.subnet_of(network))
                and (lease.attrs.backend_type != needs_mac or vtep_mac(lease))]

    @property
    def backend(self) -> str:
        return self.config.backend_type if self.config else ""

    @property
    def described(self) -> tuple[str, Footprint] | None:
        """(the BackendType this node's leases carry, what its backend leaves in the kernel);
        None when the config names no backend this build knows."""
        from flannel.backend import describe

        return describe(self.backend) if self.config else None

    @property
    def footprint(self) -> Footprint | None:
        described = self.described
        return described[1] if described is not None else None

    @property
    def vtep(self) -> bool:
        """This node's backend reaches peers through a VTEP device (vxlan)."""
        return self.footprint is not None and self.footprint.vtep

    @property
    def device(self) -> str:
        """The IPv4 device this node's backend makes ("" for none)."""
        footprint = self.footprint
        return footprint.device_name(self.vni) if footprint is not None else ""

    @property
    def vni(self) -> int:
        vni = (self.config.backend if self.config else {}).get("VNI", 1)
        return vni if isinstance(vni, int) and not isinstance(vni, bool) else 1

    @property
    def encap_port(self) -> int:
        """The UDP port peers send this backend's encapsulated packets to: the ``Port``
        option, else the declared default (0: none)."""
        footprint = self.footprint
        if footprint is None or not footprint.encap_port:
            return 0
        port = (self.config.backend if self.config else {}).get("Port", 0)
        valid = isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
        return port if valid else footprint.encap_port

    def public_ip(self) -> IPv4Address | None:
        own = self.own_lease
        return own.attrs.public_ip if own else None


Check = Callable[[Context], list[Finding]]


def all_checks() -> list[tuple[str, Check]]:
    from flannel.ops.checks import cluster, ipsec, kernel, node, probes

    return [*node.CHECKS, *cluster.CHECKS, ("ipsec", ipsec.check_ipsec), *kernel.CHECKS,
            *probes.CHECKS]

