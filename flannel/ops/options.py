"""What each ``flannelctl`` operator command was asked, typed and checked.

Owns the shape of the options of ``leases``, ``doctor``, ``check``, ``bundle`` and
``status`` once ``flannel.ctl`` has parsed the command line and resolved the store flags
(``flannel.ops.storeflags.StoreOptions``): frozen values the commands read, built once.
Nothing here parses or validates.
Must not touch: the store, the kernel, the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING

from flannel.ops.storeflags import StoreOptions

if TYPE_CHECKING:
    from flannel.ops.discover import Flanneld

DEFAULT_CNI_BIN_DIRS = (Path("/opt/cni/bin"),)
DEFAULT_CNI_CONF_DIRS = (Path("/etc/cni/net.d"),)


@dataclass(frozen=True)
class LeasesOptions:
    store: StoreOptions
    action: str  # list, show, reserve, release
    json: bool = False
    #: show and release: a subnet, lease key or public IP.
    target: str = ""
    #: reserve: the subnet and the public IP of the node it is for.
    reserve: IPv4Network | None = None
    reserve_for: IPv4Address | None = None
    yes: bool = False
    #: Which store, from whose settings (``flannel.ops.locate.Located.source``).
    source: str = ""


@dataclass(frozen=True)
class DoctorOptions:
    store: StoreOptions
    json: bool = False
    cni_bin_dirs: tuple[Path, ...] = DEFAULT_CNI_BIN_DIRS
    cni_conf_dirs: tuple[Path, ...] = DEFAULT_CNI_CONF_DIRS
    probe_timeout: float = 1.0
    fix_checksum_offload: bool = False
    #: The flanneld running here, whose store settings fill what no flag gives.
    found: Flanneld | None = None
    #: Why that flanneld's settings are unknown or partial ("" when read whole).
    note: str = ""
    #: The store flags given on the command line or in ``FLANNELD_*``.
    given: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckOptions:
    #: None with ``lab``: each node's check reads its own.
    store: StoreOptions | None
    json: bool = False
    count: int = 3
    interval: float = 0.2
    timeout: float = 1.0
    parallel: int = 128
    deadline: float = 60.0
    lab: str = ""
    lab_root: Path = Path("/run/flannel-lab")
    #: Which store, from whose settings ("" with ``lab``).
    source: str = ""
    #: The flanneld running here: the peers it parked are asked on its socket.
    found: Flanneld | None = None


@dataclass(frozen=True)
class BundleOptions:
    store: StoreOptions
    output: Path | None = None
    health_url: str = ""
    log_files: tuple[Path, ...] = ()
    journal: str = ""
    cni_bin_dirs: tuple[Path, ...] = DEFAULT_CNI_BIN_DIRS
    cni_conf_dirs: tuple[Path, ...] = DEFAULT_CNI_CONF_DIRS
    #: The flanneld running here: its status and metrics are asked on its socket.
    found: Flanneld | None = None
    #: Which store, from whose settings.
    source: str = ""
    #: Why the store is a guess (flanneld's settings unreadable, nothing given); "" if not.
    note: str = ""


@dataclass(frozen=True)
class StatusOptions:
    health_url: str = ""
    socket: str = ""
    subnet_file: str = ""
    timeout: float = 3.0
    json: bool = False
