"""What a backend leaves in a node's kernel for its peers, declared for the operator tools.

Every backend class declares its ``Footprint`` (``Backend.footprint``), next to the
``backend_type`` its leases carry, so ``flannelctl check`` and ``doctor`` judge a node of any
backend from one description instead of knowing each backend by name. A declaration only:
the backends themselves never read it, and it must stay true to what they program.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How the node's main routing table carries a peer's subnet.
PER_PEER = "per-peer"  # one route per peer subnet, made by flanneld (vxlan, host-gw, ipip)
COVERING = "covering"  # one route over the whole Network through the device (udp, wireguard)
ELSEWHERE = "elsewhere"  # no route per peer on the node: the VPC's route table carries them
BY_USER = "by-user"  # the extension's commands (the user's own) program whatever they do
NO_DATA_PATH = "no-data-path"  # subnets are only reserved (alloc)


@dataclass(frozen=True)
class Footprint:
    """``routes``: one of the constants above. ``device``: the IPv4 device flanneld makes
    (``{vni}`` stands for the VXLAN VNI; "" for none). ``answers_on_base``: that device holds
    the base address of the node's subnet, so a peer answers there whether or not it runs
    pods (else only its ``cni0`` gateway, the subnet's first address, answers). ``unjudged``:
    why the node's kernel cannot tell whether a peer is programmed ("" when it can)."""

    routes: str
    device: str = ""
    answers_on_base: bool = False
    unjudged: str = ""

    def device_name(self, vni: int) -> str:
        return self.device.replace("{vni}", str(vni))

    @property
    def has_data_path(self) -> bool:
        return self.routes != NO_DATA_PATH
