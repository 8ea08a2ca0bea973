"""The ipsec backend: pod traffic between nodes in IPsec ESP tunnels keyed by strongSwan's
charon over IKEv2 with a PSK, compatible with Go flannel's.

Owns the backend's life on the data plane contract: the config (``flannel.ipsec.config``)
checked when the backend is created; ``prepare`` finds whether the kernel carries ESP (else
charon carries it in userspace through kernel-libipsec, which sends ESP in UDP 4500 only, so
UDP encapsulation is forced and the MTU counts it) and publishes BackendType ``ipsec`` with no
data; with kernel-libipsec, our subnet's base address is put on charon's TUN
(``ipsec0``): charon routes a peer's subnet through it (table 220) only from an address
inside our subnet, and without one its CHILD_SA fails for good (the CNI bridge's address
comes with the first pod, maybe much later); the ``ipsec connections`` applier keeps
charon (started, adopted, restarted) holding our PSK, one PSK and one connection per peer
named as Go names them, and (kernel ESP) Go's XFRM policies per peer pair; a CHILD_SA that
failed under an established IKE SA is initiated again; connections of vanished peers are
unloaded and their SAs terminated. It re-checks every ``RECHECK`` seconds: a charon
restarted, a connection unloaded or a policy deleted by hand raises no event.
IKE authentication failures in charon's log are reported naming the peer (a PSK mismatch).
For ``flannelctl cleanup`` (``leftovers``): charon, when flanneld started it in this network
namespace (its marker ``/run/flannel/ipsec/charon.pid`` names it and the process runs with
flanneld's ``strongswan.conf``: stopped, which takes its SAs, TUN device and routes with it;
another charon is never stopped), flanneld's files for it (``/run/flannel/ipsec``), and the
XFRM policies of Go's shape (ESP tunnel template, reqid 11) it installs where the kernel
carries ESP.
Must not touch: the store; the PSK outside the VICI messages (never logged, in an error, in
readiness or status); connections that are not ours (other names, or another local address).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import re
import shutil
import socket
from collections.abc import Sequence
from dataclasses import replace
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendError,
    BackendOptions,
    EngineSample,
    LocalNetwork,
    PeerPlanner,
)
from flannel.backend.footprint import ELSEWHERE, Footprint, Leftovers, Place
from flannel.backend.plan import (
    Carrier,
    DevicePlan,
    EngineEntry,
    EngineReading,
    FamilyPlan,
    NodePlan,
    NodeView,
    gateway_address,
    local_addresses,
)
from flannel.config import NetworkConfig
from flannel.ipsec import charon as charon_process
from flannel.ipsec import xfrm
from flannel.ipsec.charon import (
    VICI_SOCKET,
    Charon,
    CharonError,
    CharonSpec,
    connection_names,
    find_charon,
    sa_states,
)
from flannel.ipsec.config import (
    IPSEC_OVERHEAD,
    OPTION_NAMES,
    REQID,
    UDP_ENCAP_OVERHEAD,
    IpsecConfig,
    Pair,
    child_name,
    connection_message,
    connection_name,
    established,
    shared_key_message,
)
from flannel.kernel import links, nsexec
from flannel.kernel.device import ensure_address
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.rtnl import Rtnl
from flannel.lease import Lease
from flannel.process.procscan import same_netns

log = logging.getLogger(__name__)

#: Seconds between checks of charon and its connections.
RECHECK = 5.0
#: What carries the peers: IKE on charon's ports (strongSwan's defaults, Go flannel's: 500,
#: and 4500 once NAT-T or UDPEncap moves it there), ESP in UDP on 4500 or bare ESP; IPv4
#: only. charon answers no stray datagram on its ports.
CARRIER = Carrier("IPsec (IKE and ESP)", udp_ports=(500, 4500),
                  ip_protocols=(socket.IPPROTO_ESP,), refuses=True, versions=(4,),
                  authenticated=True)
STOP_TIMEOUT = 5.0  # for charon to exit on SIGTERM before it gets SIGKILL
# charon's log, with connection names: "<name|unique id> received AUTHENTICATION_FAILED ..."
# (we are the initiator) or "... MAC mismatched" / "verification of AUTH payload ... failed"
# (we are the responder).
_AUTH_FAILED = re.compile(
    r"<(?P<name>[^|>]+)\|\d+>.*(AUTHENTICATION_FAILED|MAC mismatched|"
    r"verification of AUTH payload.*failed)")


#: The TUN device kernel-libipsec creates (charon's, never flanneld's).
TUN_DEVICE = "ipsec0"
IKE_SA = "IKE SA"
#: What an IKE SA with a peer must be: established, its CHILD_SA installed.
UP = (("state", "ESTABLISHED"), ("CHILD_SA", "INSTALLED"))
CHARON_LOG = "/run/flannel/ipsec/charon.log"
_LOG_END_PROBE = 64 * 1024  # bytes of charon's log read at start to find its last line


class IpsecBackend(Backend):
    backend_type = "ipsec"
    # No device or route of flanneld's: charon's SAs carry the peers (with kernel-libipsec
    # through charon's own ipsec0 and its routes in table 220).
    footprint = Footprint(ELSEWHERE, unjudged="charon's IPsec SAs, not routes or devices "
                          "of flanneld, carry the peers (`swanctl --list-sas` shows them)")
    option_names = OPTION_NAMES

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        IpsecConfig.from_backend(config.backend)

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, options)
        self.ipsec = IpsecConfig.from_backend(self.config.backend)
        self.libipsec = False
        self.charon: Charon | None = None
        self._applier = ConnectionApplier(self)

    @property
    def encap(self) -> bool:
        """UDP encapsulation: the option, or forced by kernel-libipsec (ESP in UDP only)."""
        return self.ipsec.udp_encap or self.libipsec

    async def prepare(self) -> LocalNetwork:
        if self.config.enable_ipv6:
            raise BackendError("the ipsec backend carries IPv4 only (as Go flannel's): set "
                               "EnableIPv6 to false in the network config")
        if self.ext.ext_addr is None:
            raise BackendError(f"the ipsec backend needs an IPv4 address on {self.ext.name} "
                               "(or --public-ip)")
        netns = self.options.host.netns
        self.libipsec = not await asyncio.to_thread(xfrm.kernel_has_esp, netns)
        spec = CharonSpec(self.libipsec,
                          wrap=lambda argv: nsexec.command(argv, self.options.host, None))
        self.charon = Charon(spec)
        log.info("IPSec config: UDPEncap=%s ESPProposal=%s (ESP %s%s)", self.ipsec.udp_encap,
                 self.ipsec.esp_proposal,
                 "in userspace: charon's kernel-libipsec" if self.libipsec else "in the kernel",
                 ", UDP encapsulation forced" if self.libipsec and not self.ipsec.udp_encap
                 else "")
        try:
            await asyncio.to_thread(self.charon.ensure)
        except CharonError as err:
            raise BackendError(str(err)) from None
        mtu = self.ipsec.mtu(self.ext.mtu, self.encap)
        if self.libipsec:
            mtu = await asyncio.to_thread(self._fit_tun, mtu)
        return LocalNetwork("ipsec", mtu)

    def _fit_tun(self, mtu: int) -> int:
        """The pods' MTU with kernel-libipsec: ``mtu`` (what ESP in UDP leaves of the external
        MTU), or less when charon's TUN carries less. kernel-libipsec gives ``ipsec0`` an MTU of
        its own (1400, which strongSwan has no option for) and reads no larger packet from it,
        so raising the TUN's MTU would truncate packets: the pods' MTU follows it instead."""
        with Rtnl(self.options.host) as sock:
            tun = links.get_link(sock, TUN_DEVICE)
        if tun is None or tun.kind != "tun":
            raise BackendError(
                f"charon runs without kernel-libipsec's TUN {TUN_DEVICE}, and this kernel has "
                "no ESP: nothing would carry the pods' packets; install kernel-libipsec "
                "(Debian: libcharon-extra-plugins) and restart flanneld (a charon that flanneld "
                "did not start must load it in its own strongswan.conf)")
        if tun.link.mtu < mtu:
            log.info("pods get MTU %d, what charon's %s carries (%s less ESP in UDP would "
                     "be %d)", tun.link.mtu, TUN_DEVICE, self.ext.name, mtu)
            return tun.link.mtu
        return mtu

    def appliers(self) -> Sequence[ConnectionApplier]:
        return (self._applier,)

    def interrupt(self) -> None:
        super().interrupt()
        if self.charon is not None:  # a VICI request under way must not hold the exit
            self.charon.interrupt()

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        return (CARRIER,)

    def ensure_local(self) -> None:
        """With kernel-libipsec: our subnet's base address on charon's TUN (when charon has
        made it: the applier starts charon and calls this again)."""
        if not self.libipsec or self.lease is None or self.lease.subnet is None:
            return
        with Rtnl(self.options.host) as sock:
            tun = links.get_link(sock, TUN_DEVICE)
        if tun is not None and tun.kind == "tun":
            ensure_address(tun.link.index, self.lease.subnet.network_address,
                           self.config.network, self.options.host)

    def close(self) -> None:
        """charon keeps running: the next flanneld adopts it with its SAs
        (``flannelctl cleanup`` stops it)."""

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def leftovers(cls, place: Place) -> Leftovers:
        found = Leftovers()
        state = place.run_dir / "flannel" / "ipsec" if place.run_dir is not None else None
        pid = charon_process.our_pid(state) if state is not None else None
        if pid is not None and same_netns(pid):
            found.items.append((f"charon process {pid} (started by flanneld's ipsec backend; "
                                "its SAs, TUN device and routes go with it)",
                                functools.partial(_stop_charon, pid)))
        elif pid is not None:
            found.kept.append(f"charon process {pid}: flanneld's, but in another network "
                              "namespace")
        if state is not None and state.is_dir() and not state.is_symlink():
            entries = sorted(state.iterdir())
            if all(entry.is_file() and not entry.is_symlink() for entry in entries):
                found.items.append((f"directory {state}",
                                    functools.partial(shutil.rmtree, state)))
            else:
                found.kept.append(f"{state}: holds something other than flanneld's files")
        try:
            policies = xfrm.our_policies(None)
        except xfrm.XfrmError:
            return found  # no iproute2 or no XFRM in this kernel: nothing of ours there
        for argv in policies:
            found.items.append((f"XFRM policy {' '.join(argv[2:])} (ESP tunnel, reqid "
                                f"{REQID})", functools.partial(_delete_policy, argv)))
        return found

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        encap = IpsecConfig.from_backend(node.config.backend).udp_encap \
            or TUN_DEVICE in node.devices  # kernel-libipsec forces it
        overhead = IPSEC_OVERHEAD + (UDP_ENCAP_OVERHEAD if encap else 0)
        return NodePlan(devices=(DevicePlan(TUN_DEVICE, 4, overhead, optional=True),),
                        overhead=overhead,
                        unjudged="charon's IPsec SAs, not routes or devices of flanneld, "
                        "carry the peers (`swanctl --list-sas` shows them)",
                        local=local_addresses(node, on_base=False))

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        libipsec = TUN_DEVICE in node.devices
        encap = IpsecConfig.from_backend(node.config.backend).udp_encap or libipsec
        # With UDP encapsulation ESP travels in UDP 4500: no bare ESP to look for.
        carrier = replace(CARRIER, ip_protocols=()) if encap else CARRIER
        own, local_ip = node.own, node.public_ip

        def plan(peer: Lease) -> tuple[FamilyPlan, ...]:
            public, subnet = peer.attrs.public_ip, peer.subnet
            if subnet is None:
                return ()
            engine: tuple[EngineEntry, ...] = ()
            if own is not None and own.subnet is not None and local_ip is not None \
                    and public is not None:
                pair = Pair(local_ip, own.subnet, public, subnet)
                engine = (EngineEntry(IKE_SA, "charon", connection_name(pair), UP),)
            return (FamilyPlan(4, subnet, public, engine=engine, carrier=carrier,
                               answers_on=gateway_address(subnet)),)

        return plan

    @classmethod
    def read_engine(cls, node: NodeView, root: Path | None) -> EngineReading:
        """charon and the vici package installed, and charon's IKE SAs (with their
        CHILD_SAs), asked over the VICI socket flanneld's charon serves (under ``root``)."""
        problems = []
        try:
            find_charon()
        except CharonError as err:
            problems.append(("error", "strongSwan's charon is not installed",
                             str(err).split("; ", 1)[-1]))
        if importlib.util.find_spec("vici") is None:
            problems.append(("error", "the vici Python package is not installed",
                             "install pyflannel with its ipsec extra (pip install "
                             "'pyflannel[ipsec]')"))
        if problems or root is None:
            return EngineReading(problems=tuple(problems))
        # /var/run is a link to /run, which would resolve in our own root, not flanneld's.
        charon = Charon(CharonSpec(libipsec=False, socket_path=root / "run" / VICI_SOCKET.name))
        try:
            with charon.session() as vici:
                sas = sa_states(vici)
        except CharonError as err:
            return EngineReading(unread=str(err), problems=((
                "error", str(err), "flanneld starts charon and restarts it when it dies: read "
                f"{CHARON_LOG} and flanneld's log for why it does not answer"),))
        entries = {}
        for sa in sas:
            for name, ike in sa.items():
                child = "INSTALLED" if any(c["state"] == b"INSTALLED"
                                           for c in ike["child-sas"].values()) \
                    else "none installed"
                entry = EngineEntry(IKE_SA, "charon", str(name), (
                    ("state", ike["state"].decode(errors="replace")), ("CHILD_SA", child)))
                entries[entry.identity] = entry
        return EngineReading(entries)


class ConnectionApplier(Applier):
    """The ``ipsec connections`` engine: charon's connections (and the kernel's XFRM
    policies) from the remote leases."""

    name = "ipsec connections"

    def __init__(self, backend: IpsecBackend) -> None:
        self.backend = backend
        self._generation = 0
        self._loaded: dict[str, Pair] = {}  # connection name -> pair, in this charon
        self._log_offset = -1
        self._failing: dict[str, str] = {}  # connection -> lease key, authentication failed
        self._established = 0
        self._childless: set[str] = set()  # connections found without a CHILD_SA last pass

    def pairs(self, peers: Sequence[Lease]) -> dict[str, Pair]:
        backend = self.backend
        own = backend.lease
        local_ip = backend.ext.ext_addr
        if own is None or own.subnet is None or not isinstance(local_ip, IPv4Address):
            return {}
        pairs = {}
        for peer in peers:
            ip, subnet = peer.attrs.public_ip, peer.subnet
            if subnet is None or ip is None or subnet == own.subnet:
                continue
            pair = Pair(local_ip, own.subnet, ip, subnet)
            pairs[connection_name(pair)] = pair
        return pairs

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        backend = self.backend
        charon = backend.charon
        if charon is None or backend.lease is None:
            return ApplyResult(recheck=RECHECK)
        try:
            generation = charon.ensure()
            backend.ensure_local()
        except CharonError as err:
            return ApplyResult(0, str(err), recheck=RECHECK)
        if self._log_offset < 0:  # failures from before this flanneld are not news
            # The end of the last whole line: its tail is enough to find it.
            self._log_offset = charon.read_log(0, _LOG_END_PROBE)[0]
        desired = self.pairs(peers)
        changes = 0
        try:
            changes += self._sync_policies(set(desired.values()))
            with charon.session() as vici:
                if generation != self._generation:
                    if self._generation:
                        log.warning("charon was restarted: loading our PSK and %d connections "
                                    "again", len(desired))
                    self._loaded = {}
                    vici.load_shared(shared_key_message(backend.ipsec.psk,
                                                        desired_local(backend)))
                    self._generation = generation
                ours = _prefix(backend)
                present = connection_names(vici, ours)
                for name in sorted(present - set(desired)):
                    vici.unload_conn({"name": name})
                    self._loaded.pop(name, None)
                    log.info("unloaded connection %s (its peer is gone)", name)
                    changes += 1
                sas = sa_states(vici)
                # SAs of vanished peers (a connection unloaded keeps its SAs, which would
                # carry traffic to whoever holds that address now).
                stale = {name for sa in sas for name in sa
                         if name.startswith(ours) and name not in desired}
                for name in sorted(stale):
                    log.info("terminating the SAs of %s (its peer is gone)", name)
                    for _ in vici.terminate({"ike": name, "timeout": -1}):
                        pass
                    changes += 1
                loaded_now: set[str] = set()
                reloaded = False
                for name, pair in sorted(desired.items()):
                    if name in present and self._loaded.get(name) == pair:
                        continue
                    vici.load_shared(shared_key_message(backend.ipsec.psk, pair.remote_ip))
                    vici.load_conn(connection_message(pair, backend.ipsec, encap=backend.encap,
                                                      install_policies=backend.libipsec))
                    self._loaded[name] = pair
                    reloaded = True
                    if name not in present:
                        log.info("loaded connection %s", name)
                        loaded_now.add(name)
                        changes += 1
                if reloaded:
                    # charon acts on a connection as it loads it (starts a new one, replaces
                    # the SAs of a changed one): the first dump may be out of date. Without a
                    # load it is not: terminating stale SAs touches no desired connection.
                    sas = sa_states(vici)
                up = established(sas, desired)
                self._established = len(up)
                # charon initiates a connection it just loaded (start_action) by itself.
                missing = [m for m in _missing_children(sas, desired) if m[0] not in loaded_now]
                for name, child in missing:
                    # charon keeps an IKE SA whose CHILD_SA failed (e.g. its TUN route), and
                    # drops one that failed to authenticate, and tries neither again by
                    # itself. Said once while it lasts (a peer that is down, or has another
                    # ESPProposal, fails every time).
                    (log.debug if name in self._childless else log.info)(
                        "connection %s has no CHILD_SA: initiating it", name)
                    for _ in vici.initiate({"ike": name, "child": child, "timeout": -1}):
                        pass
                    changes += 1
                self._childless = {name for name, _ in missing}
        except (CharonError, xfrm.XfrmError) as err:
            return ApplyResult(changes, str(err), recheck=RECHECK)
        self._report_auth_failures(desired, up)
        return ApplyResult(changes, "", recheck=RECHECK)

    def _sync_policies(self, desired: set[Pair]) -> int:
        """Go's XFRM policies, where the kernel carries ESP, read back every pass (a policy
        deleted by hand is restored); kernel-libipsec keeps its policies in charon (kernel
        ones would send packets to a kernel with no SA)."""
        if self.backend.libipsec:
            return 0
        return xfrm.sync_policies(sorted(desired, key=str), self.backend.options.host.netns)

    def _report_auth_failures(self, desired: dict[str, Pair], established: set[str]) -> None:
        """IKE authentication failures with a peer, named once while they last (until the
        peer is gone or an IKE SA with it is established)."""
        charon = self.backend.charon
        assert charon is not None
        self._log_offset, lines = charon.read_log(self._log_offset)
        for line in lines:
            match = _AUTH_FAILED.search(line)
            if match is None or match["name"] not in desired:
                continue
            name = match["name"]
            if name not in self._failing:
                pair = desired[name]
                self._failing[name] = str(pair.remote_subnet).replace("/", "-")
                log.error("IKE authentication with peer %s (subnet %s) failed: its PSK "
                          "differs from ours (connection %s); give every node the same PSK "
                          "in the network config and restart the nodes whose flanneld runs "
                          "with another", pair.remote_ip, pair.remote_subnet, name)
        for name in [n for n in self._failing if n not in desired or n in established]:
            if name in established:
                log.info("IKE authentication with connection %s succeeds again", name)
            del self._failing[name]

    def refused_peers(self) -> dict[str, str]:
        """Peers failing IKE authentication, by lease key."""
        return {key: "IKE authentication fails: another PSK" for key in self._failing.values()}

    def samples(self) -> list[EngineSample]:
        return [EngineSample("ipsec_connections", "Connections loaded into charon, one per peer.",
                             len(self._loaded)),
                EngineSample("ipsec_established_ike_sas",
                             "Peers with an established IKE SA.", self._established),
                EngineSample("ipsec_peers_failing_authentication",
                             "Peers whose IKE authentication failed (another PSK); each is "
                             "named in the log.", len(self._failing))]


def desired_local(backend: IpsecBackend) -> IPv4Address:
    ip = backend.ext.ext_addr
    assert isinstance(ip, IPv4Address)
    return ip


def _prefix(backend: IpsecBackend) -> str:
    assert backend.lease is not None
    return f"{desired_local(backend)}-{backend.lease.subnet}-"


def _missing_children(sas: Sequence[dict[str, Any]], desired: dict[str, Pair]
                      ) -> list[tuple[str, str]]:
    """(connection, child) of our connections with no IKE SA at all (charon gave up: e.g.
    after an authentication failure, until traffic hits the trap) or an established one
    that holds no installed CHILD_SA."""
    with_sa = set()
    out = []
    for sa in sas:
        for name, ike in sa.items():
            if name not in desired:
                continue
            with_sa.add(name)
            children = ike.get("child-sas") or {}
            if ike.get("state") == b"ESTABLISHED" and not any(
                    c.get("state") == b"INSTALLED" for c in children.values()):
                out.append((name, child_name(desired[name])))
    out += [(name, child_name(pair)) for name, pair in desired.items() if name not in with_sa]
    return sorted(out)



def _stop_charon(pid: int) -> None:
    if not charon_process.stop(pid, STOP_TIMEOUT):
        raise OSError(f"charon {pid} did not stop")


def _delete_policy(argv: list[str]) -> None:
    try:
        xfrm.run(argv, None)
    except xfrm.XfrmError as err:
        raise OSError(str(err)) from None
