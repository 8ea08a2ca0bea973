"""The ali-vpc route engine: our subnet routed to this ECS instance in the VPC's route table.

As Go flannel's ali-vpc did (v0.19.2): credentials from the config (``AccessKeyID``/
``AccessKeySecret``) or the ``ACCESS_KEY_ID``/``ACCESS_KEY_SECRET`` environment; region,
instance and VPC from the metadata service (100.100.100.200); the VPC's vRouter
(``DescribeVpcs``), its first route table (``DescribeVRouters``), and a ``Custom`` route
entry for our subnet with next hop type ``Instance``, next hop this instance
(``CreateRouteEntry``). Beyond Go: ``reconcile()`` repairs our entry (re-created, or pointed
back at us) and deletes entries of vanished leases - only ``Custom`` entries with an
instance as next hop strictly inside the Network, never any other entry - and throttled
calls (or calls refused because another change to the router is under way) are retried
with backoff. An entry still ``Pending`` counts as present: the router finishes it.

The API is spoken by ``flannel.cloud.aliyunrpc`` (signed RPC calls, no SDK). Every method
blocks and is meant for a worker thread; calls are serialised. The secret is held out of
``repr`` and never logged. Must not touch: the store, the kernel, entries outside the
Network or of other types.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from typing import Any

from flannel.cloud.aliyunrpc import AliyunApiError, AliyunRpc
from flannel.cloud.base import (
    CloudError,
    RouteChange,
    RouteEngineBase,
    ThrottleRetry,
    route_in_network,
)
from flannel.cloud.metadata import (
    ALIYUN_METADATA,
    AliyunIdentity,
    MetadataClient,
    aliyun_identity,
)
from flannel.cloud.options import KEY_OPTIONS, access_key, endpoint_url, string_members

log = logging.getLogger(__name__)

VERSION = "2016-04-28"
SERVICE = "Alibaba Cloud VPC"
ENTRY_TYPE = "Custom"
NEXT_HOP_TYPE = "Instance"
#: Seconds one API request may take: a pass never waits longer on one call (and its retries).
API_TIMEOUT = 10.0


def _first(answer: dict[str, Any], outer: str, inner: str) -> dict[str, Any] | None:
    """``answer[outer][inner][0]``, the way the RPC API wraps its lists, or None."""
    wrapped = answer.get(outer)
    items = wrapped.get(inner) if isinstance(wrapped, dict) else None
    if isinstance(items, list) and items and isinstance(items[0], dict):
        return items[0]
    return None


@dataclass(frozen=True)
class AliVpcConfig:
    network: IPv4Network
    access_key_id: str
    access_key_secret: str = field(repr=False)
    #: ``Endpoint``: the VPC API's URL (default ``https://vpc.<region>.aliyuncs.com``), e.g.
    #: the in-VPC ``https://vpc-vpc.cn-hangzhou.aliyuncs.com``.
    endpoint: str = ""
    #: ``MetadataURL``: the metadata service (default ``http://100.100.100.200``).
    metadata_url: str = ALIYUN_METADATA

    @classmethod
    def from_backend(cls, backend: dict[str, Any], network: IPv4Network,
                     environ: Mapping[str, str] = os.environ) -> AliVpcConfig:
        members = string_members(backend, KEY_OPTIONS)
        key_id, secret = access_key(members, environ, "Alibaba Cloud")
        return cls(network, key_id, secret,
                   endpoint_url("Endpoint", members.get("Endpoint", ""), ("http", "https")),
                   endpoint_url("MetadataURL", members.get("MetadataURL", ""), ("http",))
                   or ALIYUN_METADATA)


class AliVpcRoutes(RouteEngineBase):
    name = "ali-vpc"

    def __init__(self, config: AliVpcConfig, metadata: MetadataClient, *,
                 backoff: ThrottleRetry | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 timeout: float = API_TIMEOUT) -> None:
        super().__init__(backoff, sleep)
        self.config = config
        self.metadata = metadata
        self.timeout = timeout
        self.identity: AliyunIdentity | None = None
        self.vrouter = ""
        self.table = ""
        self._rpc: AliyunRpc | None = None

    def _call(self, action: str, params: dict[str, str]) -> dict[str, Any]:
        rpc = self._rpc
        assert rpc is not None, "_call() before prepare()"
        return self._retried(f"{SERVICE} {action}", lambda: rpc.call(action, params))

    def prepare(self) -> None:
        """Region, instance and VPC from the metadata service; the VPC's vRouter and its
        first route table."""
        with self._lock:
            identity = aliyun_identity(self.metadata)
            self._rpc = AliyunRpc(
                SERVICE, self.config.endpoint or f"https://vpc.{identity.region}.aliyuncs.com",
                VERSION, identity.region, self.config.access_key_id,
                self.config.access_key_secret, self.timeout)
            vpc = _first(self._call("DescribeVpcs", {"VpcId": identity.vpc_id}), "Vpcs", "Vpc")
            if vpc is None or not vpc.get("VRouterId"):
                raise CloudError(f"VPC {identity.vpc_id} not found in {identity.region} (the "
                                 "metadata service named it; does the key belong to this "
                                 "instance's account?)")
            self.vrouter = str(vpc["VRouterId"])
            router = _first(self._call("DescribeVRouters", {"VRouterId": self.vrouter}),
                            "VRouters", "VRouter")
            ids = router.get("RouteTableIds") if router is not None else None
            tables = ids.get("RouteTableId") if isinstance(ids, dict) else None
            if not isinstance(tables, list) or not tables:
                raise CloudError(f"no route table found on vRouter {self.vrouter} of VPC "
                                 f"{identity.vpc_id} ({identity.region})")
            self.identity = identity
            self.table = str(tables[0])
            self._status.tables = [self.table]
            self._status.target = identity.instance_id
            log.info("ali-vpc: VPC %s in %s, vRouter %s, route table %s, instance %s",
                     identity.vpc_id, identity.region, self.vrouter, self.table,
                     identity.instance_id)

    def _prepared(self) -> bool:
        return bool(self.table)

    def _entries(self) -> list[dict[str, Any]]:
        answer = self._call("DescribeRouteTables", {"RouteTableId": self.table,
                                                    "VRouterId": self.vrouter})
        table = _first(answer, "RouteTables", "RouteTable")
        if table is None:
            raise CloudError(f"route table {self.table} no longer exists; restart flanneld "
                             "to pick the vRouter's first route table again")
        entries = table.get("RouteEntrys", {})
        found = entries.get("RouteEntry") if isinstance(entries, dict) else None
        return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []

    def _inside_network(self, entry: dict[str, Any]) -> IPv4Network | None:
        if (entry.get("Type") != ENTRY_TYPE or entry.get("NextHopType") != NEXT_HOP_TYPE
                or entry.get("Status") == "Deleting"):
            return None
        return route_in_network(entry.get("DestinationCidrBlock"), self.config.network)

    def _delete(self, entry: dict[str, Any]) -> None:
        self._call("DeleteRouteEntry", {
            "RouteTableId": self.table,
            "DestinationCidrBlock": str(entry.get("DestinationCidrBlock", "")),
            "NextHopId": str(entry.get("InstanceId", ""))})

    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        assert self.identity is not None
        instance = self.identity.instance_id
        doomed: list[tuple[dict[str, Any], IPv4Network]] = []
        ours: dict[str, Any] | None = None
        if collect:
            self._orphans.begin()
        for entry in self._entries():
            destination = self._inside_network(entry)
            if destination is None:
                continue
            if destination != own:
                if self._orphan(self.table, destination, str(entry.get("InstanceId", "")),
                                live, collect):
                    doomed.append((entry, destination))
            elif entry.get("InstanceId") != instance:
                doomed.append((entry, destination))  # pointed elsewhere: ours is re-made
            else:
                ours = entry
        if collect:
            self._orphans.end()
        changes = []
        for entry, destination in doomed:
            self._delete(entry)
            changes.append(RouteChange("delete", self.table, str(destination),
                                       str(entry.get("InstanceId", ""))))
        if ours is None:
            try:
                self._call("CreateRouteEntry", {
                    "RouteTableId": self.table, "DestinationCidrBlock": str(own),
                    "NextHopType": NEXT_HOP_TYPE, "NextHopId": instance})
            except AliyunApiError as error:
                if error.code.startswith("QuotaExceeded"):
                    raise CloudError(
                        f"route table {self.table} is full: Alibaba Cloud refused the entry "
                        f"for {own} ({error.code}). Raise the route-entry quota of the VPC, or "
                        "use a backend that needs no route per node (vxlan)") from None
                raise
            changes.append(RouteChange("create", self.table, str(own), instance))
        for change in changes:
            log.info("ali-vpc: %s", change)
        return changes
