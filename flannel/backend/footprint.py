"""What a backend leaves on a node, declared for the operator tools.

Every backend class declares its ``Footprint`` (``Backend.footprint``), next to the
``backend_type`` its leases carry, so ``flannelctl cleanup`` cleans a node of any backend
from one declaration instead of knowing each backend by name (the devices it makes:
``links``), ``/status`` shows it, and ``doctor`` knows whether a backend carries IPv6 and
what its kernel cannot show. What a backend does with each peer is its description
(``flannel/backend/plan.py``), computed by its own code. A declaration only: the backends
themselves never read it, and it must stay true to what they program.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: How the node's main routing table carries a peer's subnet.
PER_PEER = "per-peer"  # one route per peer subnet, made by flanneld (vxlan, host-gw, ipip)
COVERING = "covering"  # one route over the whole Network through the device (udp, wireguard)
ELSEWHERE = "elsewhere"  # no route per peer on the node: the VPC's route table carries them
BY_USER = "by-user"  # the extension's commands (the user's own) program whatever they do
NO_DATA_PATH = "no-data-path"  # subnets are only reserved (alloc)


@dataclass(frozen=True)
class Link:
    """A device a backend makes. ``pattern``: a regular expression its names match whole;
    ``kind``: its link kind (a device of that name and another kind is not ours).
    ``userspace``: the kind it has when a userspace program serves it instead of the kernel
    ("" when never), and ``names``, the device names such a program serves (wireguard-go:
    its socket is ``<name>.sock``, its log ``/run/flannel/<name>.log``). ``entries``:
    flanneld keeps permanent neighbour and FDB entries on it."""

    pattern: str
    kind: str
    userspace: str = ""
    names: tuple[str, ...] = ()
    entries: bool = False

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.pattern, name) is not None


@dataclass(frozen=True)
class Footprint:
    """``routes``: one of the constants above. ``device``: the IPv4 device flanneld makes
    (``{vni}`` stands for the VXLAN VNI; "" for none). ``unjudged``:
    why the node's kernel cannot tell whether a peer is programmed ("" when it can).
    ``links``: every device the backend makes, in any family (what carries its traffic
    between nodes is ``Backend.carriers``, from the network config). ``vtep``: each peer
    is reached through ``device`` by a permanent neighbour and FDB entry made from the
    ``VtepMAC`` of its lease (the device's MAC is the one our lease publishes).
    ``dual_stack``: the backend carries IPv6 networks too."""

    routes: str
    device: str = ""
    unjudged: str = ""
    links: tuple[Link, ...] = ()
    vtep: bool = False
    dual_stack: bool = False

    def device_name(self, vni: int) -> str:
        return self.device.replace("{vni}", str(vni))

    @property
    def has_data_path(self) -> bool:
        return self.routes != NO_DATA_PATH


@dataclass(frozen=True)
class Place:
    """Where ``flannelctl cleanup`` looks for what a backend leaves besides its devices,
    routes, neighbour and FDB entries (``Backend.leftovers``): ``run_dir``, the node's /run
    (None: the files under it are not this node's, not looked at); ``key_file``, a key file
    named on the command line (None: the backend's default under ``run_dir``); ``devices``,
    every link of this network namespace, name -> (ifindex, kind)."""

    run_dir: Path | None
    key_file: Path | None = None
    devices: Mapping[str, tuple[int, str]] = field(default_factory=dict)


@dataclass
class Leftovers:
    """What a backend left on a node: ``items``, (what, how to remove it) in removal order;
    ``kept``, what looks like the backend's but is not (left alone, said why)."""

    items: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
