"""The lab's VPC router: one namespace's kernel routes made to follow a cloud route table.

In a cloud, the VPC's router delivers a pod subnet's traffic to the instance its route table
names. In the lab, the underlay namespace (every node's default gateway) plays that router:
``sync`` makes its routes for the table's pod subnets (tagged with the lab's own route
protocol) match what the table says, with the target instance's address as next hop. What
the table says comes from a reader: ``aws_table`` (an EC2 endpoint, e.g. moto's),
``tencent_table`` (the VPC API double's route objects), ``ali_table`` (the Alibaba Cloud VPC
API double's route entries) or ``gce_table`` (the Compute Engine double's routes and
instances).
Must not touch: routes of other protocols; any namespace but the one it is given.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any

from flannel_lab.cluster import ip

#: The route protocol marking the routes the lab's VPC router installed.
PROTOCOL = "152"


def installed(netns: str) -> dict[str, str]:
    """destination -> next hop of the router's routes in ``netns``."""
    routes = json.loads(ip(netns, "-j", "-4", "route", "show", "proto", PROTOCOL).stdout
                        or "[]")
    return {_cidr(route["dst"]): route.get("gateway", "") for route in routes}


def sync(netns: str, wanted: Mapping[str, str]) -> int:
    """Make ``netns`` route each destination via its next hop, and nothing else of ours.
    Returns the number of routes changed."""
    current = installed(netns)
    changes = 0
    for destination in current.keys() - wanted.keys():
        ip(netns, "route", "del", destination, "proto", PROTOCOL, check=False)
        changes += 1
    for destination, via in wanted.items():
        if current.get(destination) != via:
            ip(netns, "route", "replace", destination, "via", via, "proto", PROTOCOL)
            changes += 1
    return changes


def aws_table(ec2: Any, table: str, network: str) -> dict[str, str]:
    """The pod routes of an EC2 route table: destination -> private address of the target
    ENI (active routes strictly inside ``network`` only)."""
    found = ec2.describe_route_tables(RouteTableIds=[table])["RouteTables"]
    routes = found[0]["Routes"] if found else []
    by_eni = {route["DestinationCidrBlock"]: route["NetworkInterfaceId"] for route in routes
              if route.get("NetworkInterfaceId") and route.get("State", "active") == "active"
              and _inside(route.get("DestinationCidrBlock", ""), network)}
    if not by_eni:
        return {}
    enis = ec2.describe_network_interfaces(NetworkInterfaceIds=sorted(set(by_eni.values())))
    address = {eni["NetworkInterfaceId"]: eni["PrivateIpAddress"]
               for eni in enis["NetworkInterfaces"]}
    return {dst: address[eni] for dst, eni in by_eni.items() if eni in address}


def tencent_table(routes: Iterable[Mapping[str, Any]], network: str) -> dict[str, str]:
    """The pod routes of a Tencent route table: destination -> gateway address (enabled
    ``NORMAL_CVM`` routes strictly inside ``network`` only)."""
    return {route["DestinationCidrBlock"]: route["GatewayId"] for route in routes
            if route.get("GatewayType") == "NORMAL_CVM" and route.get("Enabled")
            and _inside(route.get("DestinationCidrBlock", ""), network)}


def ali_table(entries: Iterable[Mapping[str, Any]], network: str,
              addresses: Mapping[str, str]) -> dict[str, str]:
    """The pod routes of an Alibaba Cloud route table: destination -> address of the next hop
    instance (``Custom`` entries to an instance in ``addresses``, strictly inside
    ``network``; a ``Pending`` entry routes as soon as the API listed it)."""
    return {entry["DestinationCidrBlock"]: addresses[entry["InstanceId"]] for entry in entries
            if entry.get("Type") == "Custom" and entry.get("NextHopType") == "Instance"
            and entry.get("Status") in ("Available", "Pending")
            and entry.get("InstanceId") in addresses
            and _inside(entry.get("DestinationCidrBlock", ""), network)}


def gce_table(routes: Iterable[Mapping[str, Any]], addresses: Mapping[str, str],
              network: str) -> dict[str, str]:
    """The pod routes of a GCE VPC network: destination -> address of the next hop instance
    (routes to an instance strictly inside ``network`` only; of two routes to one
    destination, the one with the lower priority number wins, as in Compute Engine)."""
    found: dict[str, tuple[int, str]] = {}
    for route in routes:
        destination, hop = route.get("destRange", ""), route.get("nextHopInstance", "")
        if hop not in addresses or not _inside(destination, network):
            continue
        priority = int(route.get("priority", 1000))
        if destination not in found or priority < found[destination][0]:
            found[destination] = (priority, addresses[hop])
    return {destination: address for destination, (_, address) in found.items()}


def _inside(destination: str, network: str) -> bool:
    try:
        subnet = ipaddress.IPv4Network(destination)
    except ValueError:
        return False
    outer = ipaddress.IPv4Network(network)
    return subnet.prefixlen > outer.prefixlen and subnet.subnet_of(outer)


def _cidr(dst: str) -> str:
    return dst if "/" in dst else f"{dst}/32"
