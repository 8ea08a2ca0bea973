"""The traffic rules of flanneld's flags for this node's lease.

Owns building the rules' description (``spec.FamilyRules`` per address family: masquerade,
forward acceptance, the encapsulation filter's ports, the encapsulation pods may not send)
from the network config, the lease, the backend's encapsulation and the rules settings, and
the ``TrafficManager`` that keeps them; the daemon only wires it.
Must not touch: the store; the rules themselves (``manager.py`` installs them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flannel.config import NetworkConfig
from flannel.lease import Lease
from flannel.rules import iptables, nftables
from flannel.rules.iptables import RulesError
from flannel.rules.manager import TrafficManager
from flannel.rules.spec import FamilyRules
from flannel.settings import RulesSettings

if TYPE_CHECKING:
    from flannel.backend.base import Encapsulation


def traffic_rules(rules: RulesSettings, config: NetworkConfig, lease: Lease,
                  encapsulation: Encapsulation) -> TrafficManager:
    """The traffic rules of the flags for our lease (``TrafficManager``); with
    ``--encap-peers-only``, the filter of the backend's unauthenticated UDP ports; with
    ``--drop-pod-encap``, the drop of every port and protocol of its ``encapsulation``
    from the pod network."""
    filtered = {} if encapsulation.authenticated else encapsulation.udp
    families = []
    for version, network, subnet in ((4, config.network, lease.subnet),
                                     (6, config.ipv6_network, lease.ipv6_subnet)):
        if network is None or subnet is None:
            continue
        try:
            fully_random = (nftables.supports_fully_random() if config.enable_nftables
                            else iptables.supports_random_fully(version))
        except RulesError:
            fully_random = False  # the binary is missing: installing will say so
        families.append(FamilyRules(
            version, network, subnet, masquerade=rules.ip_masq, forward=rules.forward,
            fully_random=fully_random and not rules.fully_random_disable,
            non_masquerade=tuple(n for n in config.non_masquerade if n.version == version),
            encap_ports=filtered.get(version, ()) if rules.encap_peers_only else (),
            pod_encap_ports=encapsulation.udp.get(version, ()) if rules.drop_pod_encap else (),
            pod_encap_protocols=encapsulation.protocols.get(version, ())
            if rules.drop_pod_encap else ()))
    return TrafficManager(families, config.enable_nftables, resync=rules.resync,
                          iptables_mode=rules.iptables_mode)
