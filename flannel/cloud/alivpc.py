"""The ali-vpc route engine: our subnet routed to this ECS instance in the VPC's route table.

As Go flannel's ali-vpc did (v0.19.2): credentials from the config (``AccessKeyID``/
``AccessKeySecret``) or the ``ACCESS_KEY_ID``/``ACCESS_KEY_SECRET`` environment; region,
instance and VPC from the metadata service (100.100.100.200); the VPC's vRouter
(``DescribeVpcs``), its first route table (``DescribeVRouters``), and a ``Custom`` route
entry for our subnet with next hop type ``Instance``, next hop this instance
(``CreateRouteEntry``). Beyond Go: the entries flanneld makes carry a mark, the name
``flannel-<subnet with "." and "/" as "-">``, and only marked entries are flannel's: an
entry without it (an admin's, another tool's, one Go flannel or an older pyflannel made) is
never deleted; our own unmarked entry (made before the mark) is adopted by giving it the
name in place (``ModifyRouteEntry``). ``reconcile()`` repairs our entry (re-created, or
pointed back at us) and deletes marked entries of vanished leases - only ``Custom``
entries with an instance as next hop strictly inside the Network - and throttled calls (or
calls refused because another change to the router is under way) are retried with
backoff. An entry still ``Pending`` counts as present: the router finishes it.

The API is spoken by ``flannel.clients.aliyunrpc`` (signed RPC calls, no SDK); its answers
are decoded here within bounds, an error's ``Code`` read (throttling retried, the rest
refusals naming the fix), and read by type (``flannel.cloud.typed``: a field of the wrong
type is refused by its path). Every method blocks and is meant for a worker thread; calls
are serialised; ``interrupt()`` cuts them when flanneld stops. The secret is held out of
``repr`` and never logged. Must not touch: the store, the kernel, entries without the mark,
entries outside the Network or of other types.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from typing import Any, NamedTuple

from flannel.clients.aliyunrpc import MAX_ANSWER, AliyunRpc, AliyunUnreachable
from flannel.cloud.base import (
    ApiError,
    CloudError,
    RouteChange,
    RouteEngineBase,
    Throttled,
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
from flannel.cloud.typed import View
from flannel.untrusted import boundedjson

log = logging.getLogger(__name__)

VERSION = "2016-04-28"
SERVICE = "Alibaba Cloud VPC"
ENTRY_TYPE = "Custom"
NEXT_HOP_TYPE = "Instance"
#: Seconds one API request may take: a pass never waits longer on one call (and its retries).
API_TIMEOUT = 10.0
#: JSON elements one answer may decode into: 8,000 entries of about 12 each, and twice that.
MAX_ELEMENTS = 200_000
#: Codes that mean "slow down" (or "busy with another change to this router: try again"),
#: retried with backoff.
THROTTLING = frozenset({"Throttling", "Throttling.User", "Throttling.Api", "ServiceUnavailable",
                        "TaskConflict", "OperationConflict"})


#: Entries one route table may list (a thousand is Alibaba Cloud's largest quota).
MAX_ENTRIES = 10_000
#: What the entries flanneld creates are described as (their name is the mark).
DESCRIPTION = "pod subnet of a flannel node"


def entry_name(subnet: IPv4Network) -> str:
    """The name, and mark, of the entry flanneld makes for ``subnet``."""
    return "flannel-" + str(subnet).replace(".", "-").replace("/", "-")


class AliyunApiError(ApiError):
    def __init__(self, service: str, action: str, code: str, message: str) -> None:
        hint = ""
        if code in ("SignatureDoesNotMatch", "IncompleteSignature") or code.startswith(
                "InvalidAccessKeyId"):
            hint = " (check AccessKeyID/AccessKeySecret or ACCESS_KEY_ID/ACCESS_KEY_SECRET)"
        elif code == "NoPermission" or code.startswith("Forbidden"):
            hint = f" (the key's RAM policy needs the action vpc:{action})"
        elif code == "InvalidCIDRBlock.Duplicate":
            hint = (" (an entry for this destination is there, or still being deleted: the "
                    "next pass looks again)")
        super().__init__(service, action, code, message, hint)


def answer_of(service: str, action: str, status: int, body: bytes) -> View:
    """An answer's body, decoded: the object, for typed reads. Throttled, AliyunApiError
    (the API refused: ``Code`` and ``Message``, or the status) or CloudError (not a JSON
    object within the bounds)."""
    what = f"{service} {action}"
    try:
        answer = boundedjson.loads(body, what=f"the answer to {what}", max_bytes=MAX_ANSWER,
                                   max_elements=MAX_ELEMENTS)
    except ValueError as error:
        if status == 503:
            raise Throttled("ServiceUnavailable") from None
        raise CloudError(f"{what}: HTTP {status}, not a JSON answer ({error})") from None
    view = View(answer, f"the answer to {what}").obj(required=True)
    code = view.get("Code").text(100)
    if status != 200 or code:
        code = code or f"HTTP {status}"
        if code in THROTTLING:
            raise Throttled(code)
        raise AliyunApiError(service, action, code, view.get("Message").text(2048))
    return view


class Entry(NamedTuple):
    """What the engine reads of a route entry."""

    destination: str
    type: str
    status: str
    next_hop_type: str
    instance: str
    name: str
    id: str


def _first(answer: View, outer: str, inner: str) -> View | None:
    """``answer[outer][inner][0]``, the way the RPC API wraps its lists, or None when the
    list is empty (absent)."""
    items = answer.get(outer).get(inner).array(MAX_ENTRIES)
    return items[0].obj(required=True) if items else None


def vrouter_of(answer: View) -> str:
    """A DescribeVpcs answer's first VPC's vRouter ("" when there is none)."""
    vpc = _first(answer, "Vpcs", "Vpc")
    return vpc.get("VRouterId").text(200) if vpc is not None else ""


def route_tables_of(answer: View) -> list[str]:
    """A DescribeVRouters answer's first vRouter's route table IDs."""
    router = _first(answer, "VRouters", "VRouter")
    if router is None:
        return []
    return [table.text(200, required=True) for table in
            router.get("RouteTableIds").get("RouteTableId").array(1000)]


def entries_of(answer: View) -> list[Entry] | None:
    """A DescribeRouteTables answer's first table's entries; None when there is no table."""
    table = _first(answer, "RouteTables", "RouteTable")
    if table is None:
        return None
    entries = []
    for item in table.get("RouteEntrys").get("RouteEntry").array(MAX_ENTRIES):
        item.obj(required=True)
        entries.append(Entry(*(item.get(name).text(128) for name in (
            "DestinationCidrBlock", "Type", "Status", "NextHopType", "InstanceId",
            "RouteEntryName", "RouteEntryId"))))
    return entries


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
                 sleep: Callable[[float], None] | None = None,
                 timeout: float = API_TIMEOUT) -> None:
        super().__init__(backoff, sleep, metadata.stopper)
        self.config = config
        self.metadata = metadata
        self.timeout = timeout
        self.identity: AliyunIdentity | None = None
        self.vrouter = ""
        self.table = ""
        self._rpc: AliyunRpc | None = None
        self._unmarked: set[str] = set()  # destinations of unmarked entries, logged once

    def _call(self, action: str, params: dict[str, str]) -> View:
        rpc = self._rpc
        assert rpc is not None, "_call() before prepare()"

        def once() -> View:
            try:
                status, body = rpc.call(action, params)
            except AliyunUnreachable as error:
                hint = ("; check the node's route to the API endpoint (Endpoint)"
                        if error.timed_out else "")
                raise CloudError(f"{SERVICE} {action}: {error}{hint}") from None
            return answer_of(SERVICE, action, status, body)

        return self._retried(f"{SERVICE} {action}", once)

    def prepare(self) -> None:
        """Region, instance and VPC from the metadata service; the VPC's vRouter and its
        first route table."""
        with self._lock:
            identity = aliyun_identity(self.metadata)
            self._rpc = AliyunRpc(
                SERVICE, self.config.endpoint or f"https://vpc.{identity.region}.aliyuncs.com",
                VERSION, identity.region, self.config.access_key_id,
                self.config.access_key_secret, self.timeout, self.stopper)
            vrouter = vrouter_of(self._call("DescribeVpcs", {"VpcId": identity.vpc_id}))
            if not vrouter:
                raise CloudError(f"VPC {identity.vpc_id} not found in {identity.region} (the "
                                 "metadata service named it; does the key belong to this "
                                 "instance's account?)")
            self.vrouter = vrouter
            tables = route_tables_of(self._call("DescribeVRouters",
                                                {"VRouterId": self.vrouter}))
            if not tables:
                raise CloudError(f"no route table found on vRouter {self.vrouter} of VPC "
                                 f"{identity.vpc_id} ({identity.region})")
            self.identity = identity
            self.table = tables[0]
            self._status.tables = [self.table]
            self._status.target = identity.instance_id
            log.info("ali-vpc: VPC %s in %s, vRouter %s, route table %s, instance %s",
                     identity.vpc_id, identity.region, self.vrouter, self.table,
                     identity.instance_id)

    def _prepared(self) -> bool:
        return bool(self.table)

    def _entries(self) -> list[tuple[Entry, IPv4Network]]:
        """The entries that may be flannel's (``Custom``, to an instance, inside the
        Network), each with its destination; the rest of the answer is dropped at once."""
        entries = entries_of(self._call("DescribeRouteTables", {"RouteTableId": self.table,
                                                                "VRouterId": self.vrouter}))
        if entries is None:
            raise CloudError(f"route table {self.table} no longer exists; restart flanneld "
                             "to pick the vRouter's first route table again")
        return [(entry, destination) for entry in entries
                if (destination := self._inside_network(entry)) is not None]

    def _inside_network(self, entry: Entry) -> IPv4Network | None:
        if (entry.type != ENTRY_TYPE or entry.next_hop_type != NEXT_HOP_TYPE
                or entry.status == "Deleting"):
            return None
        return route_in_network(entry.destination, self.config.network)

    def _delete(self, entry: Entry) -> None:
        self._call("DeleteRouteEntry", {"RouteTableId": self.table,
                                        "DestinationCidrBlock": entry.destination,
                                        "NextHopId": entry.instance})

    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        assert self.identity is not None
        instance = self.identity.instance_id
        doomed: list[tuple[Entry, IPv4Network]] = []
        ours: Entry | None = None
        if collect:
            self._orphans.begin()
        for entry, destination in self._entries():
            if entry.name != entry_name(destination):
                if destination == own and entry.instance == instance:
                    ours = entry  # made before the mark: adopted below
                elif destination == own:
                    raise CloudError(
                        f"route table {self.table} sends our subnet {own} to instance "
                        f"{entry.instance} through an entry flannel did not make (it lacks "
                        f"the name {entry_name(own)}); delete that entry so that flannel can "
                        "route its subnet")
                elif entry.destination not in self._unmarked:
                    self._unmarked.add(entry.destination)
                    log.info("ali-vpc: the entry %s -> %s in %s is not marked as flannel's "
                             "(no name %s): left alone (docs/cloud.md: adopting routes)",
                             destination, entry.instance, self.table,
                             entry_name(destination))
                continue
            if destination != own:
                if self._orphan(self.table, destination, entry.instance, live, collect):
                    doomed.append((entry, destination))
            elif entry.instance != instance:
                doomed.append((entry, destination))  # pointed elsewhere: ours is re-made
            else:
                ours = entry
        if collect:
            self._orphans.end()
        changes = []
        for entry, destination in doomed:
            self._delete(entry)
            changes.append(RouteChange("delete", self.table, str(destination), entry.instance))
        if ours is None:
            try:
                self._call("CreateRouteEntry", {
                    "RouteTableId": self.table, "DestinationCidrBlock": str(own),
                    "NextHopType": NEXT_HOP_TYPE, "NextHopId": instance,
                    "RouteEntryName": entry_name(own), "Description": DESCRIPTION})
            except AliyunApiError as error:
                if error.code.startswith("QuotaExceeded"):
                    raise CloudError(
                        f"route table {self.table} is full: Alibaba Cloud refused the entry "
                        f"for {own} ({error.code}). Raise the route-entry quota of the VPC, or "
                        "use a backend that needs no route per node (vxlan)") from None
                raise
            changes.append(RouteChange("create", self.table, str(own), instance))
        elif ours.name != entry_name(own) and ours.id:
            self._call("ModifyRouteEntry", {"RouteEntryId": ours.id,
                                            "RouteEntryName": entry_name(own),
                                            "Description": DESCRIPTION})
            log.info("ali-vpc: adopted our entry %s -> %s in %s, made before flannel marked "
                     "its entries: named it %s", own, instance, self.table, entry_name(own))
        for change in changes:
            log.info("ali-vpc: %s", change)
        return changes
