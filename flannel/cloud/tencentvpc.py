"""The tencent-vpc route engine: our subnet routed to our address in the VPC's route table.

As Go flannel does: credentials from the config (``AccessKeyID``/``AccessKeySecret``) or the
``ACCESS_KEY_ID``/``ACCESS_KEY_SECRET`` environment; region and VPC from the metadata
service; the route in the first route table of the VPC, gateway type ``NORMAL_CVM``, gateway
our external address; disabled duplicates of it deleted. Beyond Go: the routes flanneld
makes carry a mark, the ``RouteDescription`` ``DESCRIPTION``, and only marked routes are
flannel's: a route without it (an admin's, one Go flannel or an older pyflannel made) is
never deleted; our own unmarked route is adopted in place (``ReplaceRoutes`` with the
description, same route). ``reconcile()`` repairs our route (re-created, or pointed back at
us) and deletes marked routes of vanished leases - only ``NORMAL_CVM`` user routes strictly
inside the Network - and throttled calls are retried with backoff.

Every method blocks (the Tencent SDK) and is meant for a worker thread; calls are
serialised. The SDK builds and signs each request and decodes its answer; the exchange
itself goes through ``flannel.cloud.sdkfetch`` (``_Connection``, in place of the SDK's
own): the whole answer within ``API_TIMEOUT`` and ``MAX_ANSWER`` bytes, at most
``MAX_ELEMENTS`` JSON elements before the SDK decodes it, never a redirect followed, cut at
once when flanneld stops. The secret is held out of ``repr`` and never logged. Must not
touch: the store, the kernel, routes without the mark, routes outside the Network or of
other gateway types.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

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
    TENCENT_METADATA,
    MetadataClient,
    TencentIdentity,
    tencent_identity,
)
from flannel.cloud.options import KEY_OPTIONS, access_key, endpoint_url, string_members
from flannel.cloud.sdkfetch import SdkSender
from flannel.untrusted.boundedjson import more_elements_than

log = logging.getLogger(__name__)

GATEWAY_TYPE = "NORMAL_CVM"
ROUTE_TYPE = "USER"
#: The mark of the routes flanneld makes; a route without it is never deleted.
DESCRIPTION = "flannel pod subnet route"
#: Seconds one API request may take, its whole answer included: a pass never waits longer
#: on one call (and its retries).
API_TIMEOUT = 10
#: An answer's bytes and JSON elements (counted before the SDK decodes it). A route table
#: holds at most a few hundred routes (~250 bytes, 12 elements each).
MAX_ANSWER = 2 * 1024 * 1024
MAX_ELEMENTS = 100_000


class TencentApiError(ApiError):
    def __init__(self, action: str, code: str, message: str) -> None:
        hint = ""
        if code.startswith("AuthFailure"):
            hint = " (check AccessKeyID/AccessKeySecret or ACCESS_KEY_ID/ACCESS_KEY_SECRET)"
        elif code == "UnauthorizedOperation":
            hint = f" (the key's CAM policy needs the action vpc:{action})"
        super().__init__("Tencent VPC", action, code, message, hint)


@dataclass(frozen=True)
class TencentVpcConfig:
    network: IPv4Network
    external_address: IPv4Address
    access_key_id: str
    access_key_secret: str = field(repr=False)
    #: ``Endpoint``: the VPC API's URL (default: the SDK's public endpoint), e.g. the
    #: in-VPC ``https://vpc.internal.tencentcloudapi.com``.
    endpoint: str = ""
    #: ``MetadataURL``: the metadata service (default ``http://metadata.tencentyun.com``).
    metadata_url: str = TENCENT_METADATA

    @classmethod
    def from_backend(cls, backend: dict[str, Any], network: IPv4Network,
                     external_address: IPv4Address,
                     environ: Mapping[str, str] = os.environ) -> TencentVpcConfig:
        members = string_members(backend, KEY_OPTIONS)
        key_id, secret = access_key(members, environ, "Tencent Cloud")
        return cls(network, external_address, key_id, secret,
                   endpoint_url("Endpoint", members.get("Endpoint", ""), ("http", "https")),
                   endpoint_url("MetadataURL", members.get("MetadataURL", ""), ("http",))
                   or TENCENT_METADATA)


class TencentVpcRoutes(RouteEngineBase):
    name = "tencent-vpc"

    def __init__(self, config: TencentVpcConfig, metadata: MetadataClient, *,
                 backoff: ThrottleRetry | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        super().__init__(backoff, sleep, metadata.stopper)
        self.config = config
        self.metadata = metadata
        self._client: Any = None
        self._models: Any = None
        self.identity: TencentIdentity | None = None
        self.table: str = ""
        self._status.target = str(config.external_address)
        self._unmarked: set[str] = set()  # unmarked routes, logged once
        self._sender = SdkSender("Tencent VPC", self.stopper, timeout=API_TIMEOUT,
                                 max_bytes=MAX_ANSWER,
                                 endpoint_hint="set Backend.Endpoint to the API's own URL")

    def _make_client(self, region: str) -> None:
        try:
            from tencentcloud.common import credential
            from tencentcloud.common.profile.client_profile import ClientProfile
            from tencentcloud.common.profile.http_profile import HttpProfile
            from tencentcloud.vpc.v20170312 import models, vpc_client
        except ImportError:
            raise CloudError("the tencent-vpc backend needs the Tencent Cloud SDK: install "
                             "pyflannel[tencent]") from None
        if self.config.endpoint:
            scheme, _, host = self.config.endpoint.partition("://")
            http = HttpProfile(protocol=scheme, endpoint=host, reqTimeout=API_TIMEOUT)
        else:
            http = HttpProfile(reqTimeout=API_TIMEOUT)
        cred = credential.Credential(self.config.access_key_id, self.config.access_key_secret)
        self._client = vpc_client.VpcClient(cred, region, ClientProfile(httpProfile=http))
        self._client.request.conn = _Connection(self._sender)
        self._models = models

    def _call(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
            TencentCloudSDKException,
        )

        request = getattr(self._models, f"{action}Request")()
        request.from_json_string(json.dumps(params))

        def once() -> dict[str, Any]:
            try:
                answer = getattr(self._client, action)(request)
            except TencentCloudSDKException as error:
                # The SDK wraps whatever its sender raised: flanneld stopping, or the
                # sender's own refusal, says what it is.
                self.stopper.check(f"Tencent VPC {action}")
                cause = error.__context__
                if isinstance(cause, CloudError):
                    raise CloudError(str(cause)) from None
                code = str(error.get_code() or "")
                if code == "RequestLimitExceeded":
                    raise Throttled(code) from None
                raise TencentApiError(action, code, str(error.get_message() or "")) from None
            decoded: dict[str, Any] = json.loads(answer.to_json_string())
            return decoded

        return self._retried(f"Tencent VPC {action}", once)

    def prepare(self) -> None:
        """Region and VPC from the metadata service; the VPC's first route table."""
        with self._lock:
            self.identity = tencent_identity(self.metadata)
            self._make_client(self.identity.region)
            answer = self._call("DescribeRouteTables", {
                "Filters": [{"Name": "vpc-id", "Values": [self.identity.vpc_id]}]})
            tables = answer.get("RouteTableSet") or []
            if not tables:
                raise CloudError(f"no suitable routing table found in VPC "
                                 f"{self.identity.vpc_id} ({self.identity.region})")
            self.table = str(tables[0]["RouteTableId"])
            self._status.tables = [self.table]
            log.info("tencent-vpc: VPC %s in %s, route table %s, gateway %s",
                     self.identity.vpc_id, self.identity.region, self.table,
                     self.config.external_address)

    def _inside_network(self, route: dict[str, Any]) -> IPv4Network | None:
        if route.get("GatewayType") != GATEWAY_TYPE or route.get("RouteType",
                                                                 ROUTE_TYPE) != ROUTE_TYPE:
            return None
        return route_in_network(route.get("DestinationCidrBlock"), self.config.network)

    def _prepared(self) -> bool:
        return bool(self.table)

    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        gateway = str(self.config.external_address)
        answer = self._call("DescribeRouteTables", {"RouteTableIds": [self.table]})
        tables = answer.get("RouteTableSet") or []
        if not tables:
            raise CloudError(f"route table {self.table} no longer exists; restart flanneld "
                             "to pick the VPC's first route table again")
        doomed: list[tuple[dict[str, Any], IPv4Network]] = []
        ours: dict[str, Any] | None = None
        misdirected: dict[str, Any] | None = None
        if collect:
            self._orphans.begin()
        for route in tables[0].get("RouteSet") or []:
            destination = self._inside_network(route)
            if destination is None:
                continue
            marked = route.get("RouteDescription") == DESCRIPTION
            to_us = route.get("GatewayId") == gateway
            if not marked and not (destination == own and to_us):
                if destination == own:
                    raise CloudError(
                        f"route table {self.table} sends our subnet {own} to "
                        f"{route.get('GatewayId')} through a route flannel did not make (its "
                        f"description is not {DESCRIPTION!r}); delete that route so that "
                        "flannel can route its subnet")
                key = f"{destination} {route.get('GatewayId')}"
                if key not in self._unmarked:
                    self._unmarked.add(key)
                    log.info("tencent-vpc: the route %s -> %s in %s is not marked as "
                             "flannel's: left alone (docs/cloud.md: adopting routes)",
                             destination, route.get("GatewayId"), self.table)
                continue
            if destination != own:
                if self._orphan(self.table, destination, str(route.get("GatewayId", "")),
                                live, collect):
                    doomed.append((route, destination))
            elif not to_us:
                misdirected = misdirected or route
            elif not route.get("Enabled") or ours is not None:
                if marked:  # disabled or duplicate, as Go deletes
                    doomed.append((route, destination))
            else:
                ours = route
        if collect:
            self._orphans.end()
        changes = []
        if doomed:
            self._call("DeleteRoutes", {"RouteTableId": self.table,
                                        "Routes": [{"RouteId": r["RouteId"]} for r, _ in doomed]})
            changes += [RouteChange("delete", self.table, str(d), str(r.get("GatewayId", "")))
                        for r, d in doomed]
        spec = {"DestinationCidrBlock": str(own), "GatewayType": GATEWAY_TYPE,
                "GatewayId": gateway, "RouteDescription": DESCRIPTION}
        if ours is None and misdirected is not None:
            self._call("ReplaceRoutes", {"RouteTableId": self.table,
                                         "Routes": [{"RouteId": misdirected["RouteId"], **spec}]})
            changes.append(RouteChange("replace", self.table, str(own), gateway))
        elif ours is None:
            try:
                self._call("CreateRoutes", {"RouteTableId": self.table,
                                            "Routes": [{**spec, "Enabled": True}]})
            except TencentApiError as error:
                if error.code == "LimitExceeded":
                    raise CloudError(
                        f"route table {self.table} is full: Tencent Cloud refused the route "
                        f"for {own} (LimitExceeded). Raise the route-per-table quota of the "
                        "VPC, or use a backend that needs no route per node (vxlan)") from None
                raise
            changes.append(RouteChange("create", self.table, str(own), gateway))
        elif ours.get("RouteDescription") != DESCRIPTION:
            self._call("ReplaceRoutes", {"RouteTableId": self.table,
                                         "Routes": [{"RouteId": ours["RouteId"], **spec}]})
            log.info("tencent-vpc: adopted our route %s -> %s in %s, made before flannel "
                     "marked its routes: described it %r", own, gateway, self.table,
                     DESCRIPTION)
        for change in changes:
            log.info("tencent-vpc: %s", change)
        return changes


class _Connection:
    """What the SDK's ``ApiRequest`` sends through (its ``conn``): the request it built and
    signed, sent by ``sender``; the answer refused when it holds more than MAX_ELEMENTS JSON
    elements, else handed back as the SDK reads it (``_Answer``)."""

    request_length = 0  # read by the SDK after each request

    def __init__(self, sender: SdkSender) -> None:
        self._sender = sender

    def request(self, method: str, url: str, body: bytes | str | None = None,
                headers: dict[str, str] | None = None) -> _Answer:
        sent = headers or {}
        action = sent.get("X-TC-Action", "call")
        reply = self._sender.exchange(action, method, url, body, sent)
        if more_elements_than(reply.body, MAX_ELEMENTS):
            raise CloudError(f"Tencent VPC {action}: the answer holds more than "
                             f"{MAX_ELEMENTS} JSON elements; not read")
        return _Answer(reply.status, reply.headers, reply.body)


class _Answer:
    """An answer as the SDK reads it: its status, headers (by their usual spelling) and
    body."""

    reason = ""
    raw = type("Raw", (), {"version": 11})  # what the SDK's debug log reads of the exchange

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = {"-".join(part.capitalize() for part in name.split("-")): value
                        for name, value in headers.items()}
        self.content = body
        self.text = body.decode("utf-8", "replace")
