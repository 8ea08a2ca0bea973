"""The ipsec backend's options and what it asks of charon, as Go flannel sets them up.

Owns: decoding the ``Backend`` object (``PSK`` of at least 96 characters, ``UDPEncap`` false,
``ESPProposal`` ``aes128gcm16-sha256-prfsha256-ecp256``; member names case-insensitive), the
MTU (external MTU minus 77, minus 8 more with UDP encapsulation), the names Go gives a peer's
connection (``<localPublicIP>-<localSubnet>-<remoteSubnet>-<remotePublicIP>``) and its child
(``<localSubnet>-<remoteSubnet>``), and the VICI messages: ``load-shared`` for a PSK and
``load-conn`` for one peer pair with Go's parameters (IKEv2, ``aes256-sha256-modp4096``,
keyingtries 0, PSK auth, child in tunnel mode with reqid 11, start/trap/restart, rekey 1h).

API: ``IpsecConfig.from_backend(backend_obj)`` (raises ``BackendConfigError``), ``cfg.mtu``,
``Pair`` (one local/remote lease pair), ``connection_name``, ``child_name``,
``established`` (the connections with an established IKE SA in a ``list-sas`` answer),
``shared_key_message``, ``connection_message``.
The PSK is a ``Secret``: its repr hides it; it is never in a message or a log line.
Must not touch: files, the kernel, charon (``flannel.ipsec.charon`` talks to it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from flannel.backendconf.errors import BackendConfigError
from flannel.backendconf.options import decode_options
from flannel.untrusted import gojson

DEFAULT_ESP_PROPOSAL = "aes128gcm16-sha256-prfsha256-ecp256"
MIN_PSK_LENGTH = 96
IKE_PROPOSAL = "aes256-sha256-modp4096"
REQID = 11
# Outer IPv4 header, ESP header, IV, padding, trailer and ICV, as Go counts them.
IPSEC_OVERHEAD = 77
UDP_ENCAP_OVERHEAD = 8
# strongSwan rejects longer names and proposals anyway; a bound keeps the messages small.
_MAX_PROPOSAL = 256
_MAX_PSK = 4096
_CONTEXT = "error decoding IPSEC backend config"
_OPTIONS: dict[str, tuple[type, Any]] = {
    "UDPEncap": (bool, False), "ESPProposal": (str, DEFAULT_ESP_PROPOSAL), "PSK": (str, ""),
}
OPTION_NAMES = tuple(_OPTIONS)


class Secret(str):
    """A string that never shows itself in a repr (a PSK)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret(<hidden>)"


@dataclass(frozen=True)
class IpsecConfig:
    psk: Secret
    udp_encap: bool = False
    esp_proposal: str = DEFAULT_ESP_PROPOSAL

    @classmethod
    def from_backend(cls, backend: dict[str, Any]) -> IpsecConfig:
        fields = decode_options(backend, _OPTIONS, _CONTEXT, secrets={
            "PSK": f"PSK must be a string of at least {MIN_PSK_LENGTH} characters"})
        psk = fields["PSK"]
        if len(psk) < MIN_PSK_LENGTH:
            # Go's words, then the fix (the length of a PSK says little about it).
            raise BackendConfigError(
                f"config error, password is too short: the ipsec backend's PSK has "
                f"{len(psk)} characters, it needs at least {MIN_PSK_LENGTH}; give every "
                "node the same PSK in the network config's Backend (e.g. from "
                "`openssl rand -hex 48`)")
        if len(psk) > _MAX_PSK or not psk.isprintable():
            raise BackendConfigError(f"{_CONTEXT}: PSK must be at most {_MAX_PSK} printable "
                                     "characters")
        proposal = fields["ESPProposal"]
        if (not proposal or len(proposal) > _MAX_PROPOSAL
                or not all(c.isalnum() or c in "-_" for c in proposal)):
            raise BackendConfigError(
                f"{_CONTEXT}: ESPProposal {gojson.shown(proposal)} is not a strongSwan ESP "
                "proposal (letters, digits and dashes, e.g. "
                f"{DEFAULT_ESP_PROPOSAL}); leave it out for the default")
        return cls(Secret(psk), fields["UDPEncap"], proposal)

    def mtu(self, ext_mtu: int, udp_encap: bool | None = None) -> int:
        """The MTU pods get: the external MTU less ESP's overhead (and UDP's when
        encapsulated; ``udp_encap`` overrides the option when the data path forces it)."""
        encap = self.udp_encap if udp_encap is None else udp_encap
        return ext_mtu - IPSEC_OVERHEAD - (UDP_ENCAP_OVERHEAD if encap else 0)


@dataclass(frozen=True)
class Pair:
    """Our lease and one peer's, as the connection between them needs them."""

    local_ip: IPv4Address
    local_subnet: IPv4Network
    remote_ip: IPv4Address
    remote_subnet: IPv4Network


def connection_name(pair: Pair) -> str:
    return f"{pair.local_ip}-{pair.local_subnet}-{pair.remote_subnet}-{pair.remote_ip}"


def child_name(pair: Pair) -> str:
    return f"{pair.local_subnet}-{pair.remote_subnet}"


def established(sas: Iterable[dict[str, Any]], names: Collection[str]) -> set[str]:
    """Which of the connections ``names`` hold an established IKE SA in ``sas`` (charon's
    ``list-sas`` answer: one ``{connection: IKE SA}`` per SA)."""
    return {name for sa in sas for name, ike in sa.items()
            if name in names and ike.get("state") == b"ESTABLISHED"}


def shared_key_id(owner: IPv4Address) -> str:
    """The id our shared keys carry, so loading one again replaces it instead of adding a
    copy each pass (Go loads them without an id)."""
    return f"flannel-{owner}"


def shared_key_message(psk: Secret, owner: IPv4Address) -> dict[str, Any]:
    """``load-shared``: the IKE PSK for one public address (ours or a peer's)."""
    return {"id": shared_key_id(owner), "type": "IKE", "data": str(psk), "owners": [str(owner)]}


def connection_message(pair: Pair, cfg: IpsecConfig, *, encap: bool,
                       install_policies: bool) -> dict[str, Any]:
    """``load-conn`` for one peer pair, with Go's parameters. ``encap``: force UDP
    encapsulation (the option, or a data path that carries ESP only in UDP).
    ``install_policies``: charon installs the child's policies itself and picks each child's
    reqid (a userspace ESP data path, whose policies live in charon: kernel-libipsec finds
    the SA for a packet by reqid alone, so one reqid for every peer would send all to one);
    Go leaves the policies to flanneld's XFRM policies, which find the SA by reqid 11 and
    the peer's address. The reqid never leaves the node."""
    child = {
        "local_ts": [str(pair.local_subnet)], "remote_ts": [str(pair.remote_subnet)],
        "esp_proposals": [cfg.esp_proposal], "start_action": "start", "close_action": "trap",
        "dpd_action": "restart", "mode": "tunnel", "rekey_time": "1h",
        "policies": "yes" if install_policies else "no",
    }
    if not install_policies:
        child["reqid"] = str(REQID)
    return {connection_name(pair): {
        "local_addrs": [str(pair.local_ip)], "remote_addrs": [str(pair.remote_ip)],
        "proposals": [IKE_PROPOSAL], "version": "2", "keyingtries": "0",
        "encap": "yes" if encap else "no",
        "local": {"auth": "psk"}, "remote": {"auth": "psk"},
        "children": {child_name(pair): child},
    }}
