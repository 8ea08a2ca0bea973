"""The aws-vpc route engine: our subnet routed to our ENI in the VPC's route table(s).

At ``prepare()``: the instance, region and the ENI holding the external address come from
the instance metadata service; SourceDestCheck is disabled on that ENI; the route tables are
resolved (``RouteTableID`` from the config, else the table associated with the node's
subnet, else the VPC's main table); blackhole routes inside the flannel Network are removed
from them (as Go flannel does: their target is gone). ``reconcile()`` then makes our route
exist and point at our ENI, and removes routes of vanished leases.

EC2 routes carry no tag or description, so flanneld marks the next hop instead: our ENI
carries the tag ``flannel.io/pod-subnet`` with our subnet (``CreateTags``). A route is
flannel's only when its target ENI (or instance) carries that tag naming the route's own
destination; only such routes of vanished leases are deleted, and our subnet's route is
pointed back at us only from a flannel node's ENI (or a blackhole): an admin's route to an
instance is never touched. Routes made before the tag are adopted when their node tags its
ENI (at its first pass). Throttled calls are retried with backoff.

Every method blocks (boto3) and is meant for a worker thread; calls are serialised. boto3
builds and signs each request and parses its answer; the exchange itself goes through
``flannel.cloud.sdkfetch`` (botocore's ``before-send`` hook): the whole answer within
``API_TIMEOUT`` and ``MAX_ANSWER`` bytes, at most ``MAX_TAGS`` XML tags before botocore
parses it, never a redirect followed, cut at once when flanneld stops. The
credentials are boto3's default chain and are never logged. Must not touch: the store, the
kernel, routes outside the Network, routes whose target does not carry the mark.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from flannel.backendconf.errors import BackendConfigError
from flannel.cloud.base import (
    ApiError,
    CloudError,
    RouteChange,
    RouteEngineBase,
    Throttled,
    ThrottleRetry,
    route_in_network,
)
from flannel.cloud.metadata import AwsIdentity, MetadataClient, aws_identity
from flannel.cloud.sdkfetch import SdkSender
from flannel.untrusted import gojson

log = logging.getLogger(__name__)

_ROUTE_TABLE_ID = re.compile(r"rtb-[0-9a-f]{8,32}", re.ASCII)
_THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
_MAX_ROUTE_TABLES = 16
#: Seconds one API request may take, its whole answer included: a pass never waits longer
#: on one call (and its retries).
API_TIMEOUT = 10
#: An answer's bytes and XML tags (``<``, counted before botocore parses it: tiny elements
#: cost far more parsed than sent). The largest answer, DescribeRouteTables of 16 tables of
#: 1000 routes (EC2's most), is ~4.5 MB and ~230,000 tags.
MAX_ANSWER = 8 * 1024 * 1024
MAX_TAGS = 300_000
#: The tag on a node's ENI that marks the routes to it as flannel's: its value is the
#: node's subnet, the destination of its one route.
MARK = "flannel.io/pod-subnet"


class AwsApiError(ApiError):
    def __init__(self, action: str, code: str, message: str) -> None:
        hint = ""
        if code in ("UnauthorizedOperation", "AuthFailure", "AccessDenied"):
            hint = f" (the node's IAM role needs the permission ec2:{action})"
        super().__init__("EC2", action, code, message, hint)


@dataclass(frozen=True)
class AwsVpcConfig:
    """The backend options (``RouteTableID``: a string or a list, as Go flannel read it)."""

    network: IPv4Network
    external_address: IPv4Address
    route_table_ids: tuple[str, ...] = ()

    @classmethod
    def from_backend(cls, backend: dict[str, Any], network: IPv4Network,
                     external_address: IPv4Address) -> AwsVpcConfig:
        members = gojson.fold_keys(backend, {"routetableid": "RouteTableID"})
        raw = members.get("RouteTableID")
        if raw is None or raw == "":
            ids: list[Any] = []
        elif isinstance(raw, str):
            ids = [raw]
        elif isinstance(raw, list):
            ids = raw
        else:
            raise BackendConfigError(f"Backend.RouteTableID must be a string or a list of strings, "
                                     f"not a {gojson.type_name(raw)}")
        if len(ids) > _MAX_ROUTE_TABLES:
            raise BackendConfigError(f"Backend.RouteTableID lists {len(ids)} tables; at most "
                                     f"{_MAX_ROUTE_TABLES} are supported")
        for table in ids:
            if not isinstance(table, str) or not _ROUTE_TABLE_ID.fullmatch(table):
                raise BackendConfigError(
                    f"Backend.RouteTableID: {str(table)[:80]!r} is not a route "
                    "table ID (rtb- followed by hex digits)")
        return cls(network, external_address, tuple(dict.fromkeys(ids)))


class AwsVpcRoutes(RouteEngineBase):
    name = "aws-vpc"

    def __init__(self, config: AwsVpcConfig, metadata: MetadataClient, *,
                 endpoint_url: str | None = None, backoff: ThrottleRetry | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        super().__init__(backoff, sleep, metadata.stopper)
        self.config = config
        self.metadata = metadata
        self.endpoint_url = endpoint_url
        self._ec2: Any = None
        self.identity: AwsIdentity | None = None
        self.tables: tuple[str, ...] = ()
        self._marked = ""  # the subnet our ENI's tag names, once written
        self._unmarked: set[tuple[str, str]] = set()  # (destination, target), logged once
        self._sender = SdkSender("EC2", self.stopper, timeout=API_TIMEOUT,
                                 max_bytes=MAX_ANSWER,
                                 endpoint_hint="set AWS_ENDPOINT_URL_EC2 to the API's own URL")

    # --- calls -------------------------------------------------------------------------

    def _client(self, region: str) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise CloudError("the aws-vpc backend needs boto3: install pyflannel[aws]") from None
        # Our own retry loop handles throttling (and logs it); botocore's would hide it.
        config = Config(retries={"total_max_attempts": 1}, connect_timeout=5,
                        read_timeout=API_TIMEOUT)
        client = boto3.session.Session().client("ec2", region_name=region,
                                                endpoint_url=self.endpoint_url, config=config)
        client.meta.events.register("before-send.ec2", self._send)
        return client

    def _send(self, request: Any, event_name: str = "", **_: Any) -> Any:
        """One signed request, sent through the bounded fetch instead of botocore's own
        sender; its answer goes back to botocore to parse, once within its bounds."""
        from botocore.awsrequest import AWSResponse

        action = event_name.rsplit(".", 1)[-1]
        body = request.body
        if body is not None and not isinstance(body, (bytes, str)):
            body = body.read()
        reply = self._sender.exchange(action, request.method, request.url, body,
                                      dict(request.headers.items()))
        if reply.body.count(b"<") > MAX_TAGS:
            raise CloudError(f"EC2 {action}: the answer holds more than {MAX_TAGS} XML tags; "
                             "not read")
        return AWSResponse(request.url, reply.status, reply.headers, _Body(reply.body))

    def _call(self, action: str, method: str, **params: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        def once() -> dict[str, Any]:
            try:
                answer: dict[str, Any] = getattr(self._ec2, method)(**params)
                return answer
            except ClientError as error:
                details = error.response.get("Error", {})
                code = str(details.get("Code", ""))
                if code in _THROTTLE_CODES:
                    raise Throttled(code) from None
                raise AwsApiError(action, code, str(details.get("Message", ""))) from None
            except BotoCoreError as error:
                raise CloudError(f"EC2 {action} failed: {error}") from None

        return self._retried(f"EC2 {action}", once)

    # --- start -------------------------------------------------------------------------

    def prepare(self) -> list[RouteChange]:
        """Identity, SourceDestCheck, route tables, blackhole clean-up. Returns deletions."""
        with self._lock:
            identity = aws_identity(self.metadata, self.config.external_address)
            self.identity = identity
            self._ec2 = self._client(identity.region)
            self._status.target = identity.eni_id
            self._status.warnings = []
            log.info("aws-vpc: instance %s in %s, ENI %s (subnet %s, VPC %s)",
                     identity.instance_id, identity.region, identity.eni_id,
                     identity.subnet_id, identity.vpc_id)
            self._disable_source_dest_check(identity.eni_id)
            self.tables = self.config.route_table_ids or (self._discover_table(identity),)
            self._status.tables = list(self.tables)
            changes = []
            for table in self._describe_tables():
                for route in table.get("Routes", []):
                    destination = self._inside_network(route)
                    if destination is not None and route.get("State") == "blackhole":
                        changes.append(self._delete(_table_id(table), destination,
                                                    _target_of(route)))
            return changes

    def _disable_source_dest_check(self, eni_id: str) -> None:
        try:
            self._call("ModifyNetworkInterfaceAttribute", "modify_network_interface_attribute",
                       NetworkInterfaceId=eni_id, SourceDestCheck={"Value": False})
        except CloudError as error:
            warning = (f"could not disable SourceDestCheck on {eni_id} ({error}); EC2 drops "
                       "traffic for pods on this node until it is disabled: grant the node's "
                       "IAM role ec2:ModifyNetworkInterfaceAttribute or disable it by hand")
            log.warning("aws-vpc: %s", warning)
            self._status.warnings.append(warning)

    def _discover_table(self, identity: AwsIdentity) -> str:
        for filters in ([{"Name": "association.subnet-id", "Values": [identity.subnet_id]}],
                        [{"Name": "vpc-id", "Values": [identity.vpc_id]},
                         {"Name": "association.main", "Values": ["true"]}]):
            found = self._call("DescribeRouteTables", "describe_route_tables",
                               Filters=filters).get("RouteTables", [])
            if found:
                table = _table_id(found[0])
                log.info("aws-vpc: using route table %s (no RouteTableID configured)", table)
                return table
        raise CloudError(f"no route table is associated with subnet {identity.subnet_id} and "
                         f"VPC {identity.vpc_id} has no main table; set Backend.RouteTableID")

    def _describe_tables(self) -> list[dict[str, Any]]:
        try:
            tables: list[dict[str, Any]] = self._call(
                "DescribeRouteTables", "describe_route_tables",
                RouteTableIds=list(self.tables)).get("RouteTables", [])
            return tables
        except AwsApiError as error:
            if error.code == "InvalidRouteTableID.NotFound":
                raise CloudError(f"{error}; check Backend.RouteTableID ({', '.join(self.tables)}"
                                 f") against the route tables of region "
                                 f"{self.identity.region if self.identity else '?'}") from None
            raise

    # --- reconcile ---------------------------------------------------------------------

    def _inside_network(self, route: dict[str, Any]) -> IPv4Network | None:
        return route_in_network(route.get("DestinationCidrBlock"), self.config.network)

    def _prepared(self) -> bool:
        return self._ec2 is not None and self.identity is not None

    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        assert self.identity is not None  # _prepared()
        eni_id = self.identity.eni_id
        self._mark(eni_id, own)
        changes = []
        misdirected: list[tuple[str, dict[str, Any]]] = []
        orphans: list[tuple[str, IPv4Network, dict[str, Any]]] = []
        if collect:
            self._orphans.begin()
        for table in self._describe_tables():
            table_id = _table_id(table)
            ours = None
            for route in table.get("Routes", []):
                destination = self._inside_network(route)
                if destination is None:
                    continue
                if destination == own:
                    ours = route
                elif _target_of(route) and self._orphan(table_id, destination,
                                                        _target_of(route), live, collect):
                    orphans.append((table_id, destination, route))
            if ours is None:
                changes.append(self._create(table_id, own, eni_id))
            elif ours.get("NetworkInterfaceId") != eni_id or ours.get("State") != "active":
                misdirected.append((table_id, ours))
        if collect:
            self._orphans.end()
        if misdirected or orphans:
            marks = self._marks([route for _, route in misdirected]
                                + [route for _, _, route in orphans])
            for table_id, route in misdirected:
                if route.get("State") == "blackhole" or marks.get(_target_of(route)):
                    changes.append(self._replace(table_id, own, eni_id))
                else:
                    raise CloudError(
                        f"route table {table_id} sends our subnet {own} to "
                        f"{_target_of(route) or 'a gateway'}, which is not a flannel node "
                        f"(no tag {MARK}); delete that route so that flannel can route its "
                        "subnet")
            for table_id, destination, route in orphans:
                target = _target_of(route)
                if str(destination) in marks.get(target, ()):
                    changes.append(self._delete(table_id, destination, target))
                elif (str(destination), target) not in self._unmarked:
                    self._unmarked.add((str(destination), target))
                    log.info("aws-vpc: the route %s -> %s in %s is not marked as flannel's "
                             "(%s has no tag %s=%s): left alone (docs/cloud.md: adopting "
                             "routes)", destination, target, table_id, target, MARK,
                             destination)
        return changes

    def _mark(self, eni_id: str, own: IPv4Network) -> None:
        """Tag our ENI with our subnet (once per subnet): the mark of our route."""
        if self._marked == str(own):
            return
        try:
            self._call("CreateTags", "create_tags", Resources=[eni_id],
                       Tags=[{"Key": MARK, "Value": str(own)}])
        except CloudError as error:
            warning = (f"could not tag {eni_id} with {MARK}={own} ({error}): other nodes "
                       "cannot tell our route is flannel's, so they will never delete it "
                       "once our lease is gone; grant the node's IAM role ec2:CreateTags")
            if warning not in self._status.warnings:
                log.warning("aws-vpc: %s", warning)
                self._status.warnings.append(warning)
            return
        self._marked = str(own)

    def _marks(self, routes: list[dict[str, Any]]) -> dict[str, set[str]]:
        """The subnets the routes' targets are tagged with (target -> subnets); empty, and
        said once, when the tags cannot be read: then nothing counts as marked."""
        enis = sorted({str(r["NetworkInterfaceId"]) for r in routes
                       if r.get("NetworkInterfaceId")})
        instances = sorted({str(r["InstanceId"]) for r in routes
                            if r.get("InstanceId") and not r.get("NetworkInterfaceId")})
        marks: dict[str, set[str]] = {}
        try:
            found = []
            if enis:
                found += self._call("DescribeNetworkInterfaces", "describe_network_interfaces",
                                    Filters=[{"Name": "network-interface-id",
                                              "Values": enis}]).get("NetworkInterfaces", [])
            if instances:
                found += self._call("DescribeNetworkInterfaces", "describe_network_interfaces",
                                    Filters=[{"Name": "attachment.instance-id",
                                              "Values": instances}]).get("NetworkInterfaces",
                                                                         [])
        except AwsApiError as error:
            warning = (f"cannot read the tags of route targets ({error}): no route is "
                       "deleted or redirected until they can be read; grant the node's IAM "
                       "role ec2:DescribeNetworkInterfaces")
            if warning not in self._status.warnings:
                log.warning("aws-vpc: %s", warning)
                self._status.warnings.append(warning)
            return {}
        for interface in found:
            tags = {str(t.get("Key")): str(t.get("Value")) for t in
                    interface.get("TagSet") or [] if isinstance(t, dict)}
            if MARK not in tags:
                continue
            for target in (interface.get("NetworkInterfaceId"),
                           (interface.get("Attachment") or {}).get("InstanceId")):
                if target:
                    marks.setdefault(str(target), set()).add(tags[MARK])
        return marks

    def _create(self, table: str, destination: IPv4Network, eni_id: str) -> RouteChange:
        try:
            self._call("CreateRoute", "create_route", RouteTableId=table,
                       DestinationCidrBlock=str(destination), NetworkInterfaceId=eni_id)
        except AwsApiError as error:
            if error.code == "RouteAlreadyExists":  # created since we looked: point it at us
                return self._replace(table, destination, eni_id)
            if error.code == "RouteLimitExceeded":
                raise CloudError(
                    f"route table {table} is full: EC2 refused the route for {destination} "
                    "(RouteLimitExceeded; a VPC route table holds 50 routes by default). Raise "
                    "the 'Routes per route table' quota in Service Quotas (Amazon VPC), or use "
                    "a backend that needs no route per node (vxlan)") from None
            raise
        change = RouteChange("create", table, str(destination), eni_id)
        log.info("aws-vpc: %s", change)
        return change

    def _replace(self, table: str, destination: IPv4Network, eni_id: str) -> RouteChange:
        self._call("ReplaceRoute", "replace_route", RouteTableId=table,
                   DestinationCidrBlock=str(destination), NetworkInterfaceId=eni_id)
        change = RouteChange("replace", table, str(destination), eni_id)
        log.info("aws-vpc: %s", change)
        return change

    def _delete(self, table: str, destination: IPv4Network, target: str) -> RouteChange:
        try:
            self._call("DeleteRoute", "delete_route", RouteTableId=table,
                       DestinationCidrBlock=str(destination))
        except AwsApiError as error:
            if error.code != "InvalidRoute.NotFound":  # already gone is what we wanted
                raise
        change = RouteChange("delete", table, str(destination), target)
        log.info("aws-vpc: %s", change)
        return change


class _Body:
    """An answer's body as botocore reads it (``AWSResponse.raw``)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


def _table_id(table: dict[str, Any]) -> str:
    """A described route table's ID; botocore types the fields it finds, but any may be
    missing."""
    value = table.get("RouteTableId")
    if not isinstance(value, str) or not value:
        raise CloudError("EC2 DescribeRouteTables answered a route table without its "
                         "routeTableId")
    return value


def _target_of(route: dict[str, Any]) -> str:
    """The instance or ENI a route points at; empty for any other target."""
    return str(route.get("NetworkInterfaceId") or route.get("InstanceId") or "")
