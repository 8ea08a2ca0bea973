"""A double of Alibaba Cloud's VPC API (RPC style, version 2016-04-28), for the actions the
ali-vpc engine calls; served to the lab's nodes (``flannel-lab up --backend ali-vpc``) and used
by the tests. There is no emulator of Alibaba Cloud to run here.

Modelled from Alibaba Cloud's public API reference (help.aliyun.com / alibabacloud.com, "VPC
API 2016-04-28": the request structure, signature method and common error codes, and the pages
of DescribeVpcs, DescribeVRouters, DescribeRouteTables, CreateRouteEntry, DeleteRouteEntry and
ModifyRouteEntry). The protocol: ``GET /?<query>`` or ``POST /`` with a form body, the common
parameters (``Action``, ``Version``, ``Format``, ``AccessKeyId``, ``SignatureMethod``
HMAC-SHA1, ``SignatureVersion`` 1.0, ``SignatureNonce``, ``Timestamp``) and ``Signature``,
which it verifies: an unknown key ``InvalidAccessKeyId.NotFound`` (404), a wrong signature
``SignatureDoesNotMatch`` (400), a nonce used twice ``SignatureNonceUsed``, a timestamp more
than 15 minutes off ``InvalidTimeStamp.Expired``. Answers are JSON with ``RequestId``; errors
carry ``Code``, ``Message``, ``HostId`` and ``Recommend`` with the documented HTTP status
(``InvalidAction.NotFound`` 404, ``InvalidVersion``, ``MissingParameter``,
``Throttling``/``Throttling.User`` 400, ``ServiceUnavailable`` 503).

State: VPCs (``VpcId`` -> ``VRouterId``), vRouters (-> ``RouteTableIds``), route tables with
entries (``RouteTableId``, ``DestinationCidrBlock``, ``Type`` Custom/System, ``Status``,
``InstanceId``, ``NextHopType``, ``NextHops``, ``RouteEntryId``, ``RouteEntryName``), listed
inside ``RouteEntrys.RouteEntry`` as the API spells it. A created entry is ``Pending`` until
the next DescribeRouteTables, then ``Available`` (the API creates entries in the background).
``CreateRouteEntry`` refuses a destination already in the table
(``InvalidCIDRBlock.Duplicate``), an unknown instance (``InvalidInstanceId.NotFound``) and,
past ``entry_limit`` custom entries, ``QuotaExceeded``; ``DeleteRouteEntry`` by destination and
next hop (``InvalidRouteEntry.NotFound``); ``ModifyRouteEntry`` renames an entry by
``RouteEntryId`` (``InvalidRouteEntryId.NotFound``; a name over 128 characters or starting with
``http://`` is ``IllegalParam.Name``). ``fail(action, code, times)`` queues errors;
``answer_with(action, behaviour, times)`` a broken or hostile answer (``flannel_lab.hostile``);
``delay`` holds every answer back (timeouts). Not modelled: other actions, pagination beyond
one page, ECMP next hops, RAM policies, STS tokens, route entries of other next hop types than
those tests add.

``FakeAliyunMetadata`` models the ECS instance metadata service (100.100.100.200), from the
same reference's "instance metadata" pages: ``GET /latest/meta-data/<path>`` answers the asking
instance's value (instances told apart by their source address, as the real service does), 404
for an unknown path; hardened mode: ``PUT /latest/api/token`` with
``X-aliyun-ecs-metadata-token-ttl-seconds`` (1..21600, else 400) issues a token that GETs carry
in ``X-aliyun-ecs-metadata-token`` (an unknown one: 401). ``enforced``: a GET without a token
is refused (403), as on an instance whose metadata access is set to hardened mode only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from calendar import timegm
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from flannel.kernel.host import LOCAL, Host
from flannel_lab.hostile import Behaviour, Queued
from flannel_lab.imds import TokenMetadata
from flannel_lab.served import endpoint, serve, shut

VERSION = "2016-04-28"
#: HTTP status of each error code the double sends (400 unless named here).
_STATUS = {"InvalidAccessKeyId.NotFound": 404, "InvalidAction.NotFound": 404,
           "ServiceUnavailable": 503, "Forbidden.RAM": 403, "InvalidRouteEntry.NotFound": 404,
           "InvalidInstanceId.NotFound": 404, "InvalidVpcId.NotFound": 404,
           "InvalidRouteEntryId.NotFound": 404}
_MESSAGES = {
    "Throttling": "Request was denied due to request throttling.",
    "Throttling.User": "Request was denied due to user flow control.",
    "ServiceUnavailable": "The request has failed due to a temporary failure of the server.",
    "QuotaExceeded": "Route entry quota exceeded in this route table",
    "TaskConflict": "The operation conflicts with another task. Please try again later.",
    "Forbidden.RAM": "User not authorized to operate on the specified resource, or this API "
                     "doesn't support RAM.",
}


class ApiError(Exception):
    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.message = message or _MESSAGES.get(code, code)


def _percent(text: str) -> str:
    return quote(text, safe="-_.~")


class FakeAliyunVpc:
    def __init__(self, credentials: dict[str, str], region: str = "cn-hangzhou") -> None:
        self.credentials = dict(credentials)
        self.region = region
        self.vpcs: dict[str, str] = {}  # VpcId -> VRouterId
        self.vrouters: dict[str, list[str]] = {}  # VRouterId -> RouteTableIds
        self.tables: dict[str, list[dict[str, Any]]] = {}  # RouteTableId -> entries
        self.instances: set[str] = set()
        self.entry_limit: int | None = None
        self.delay = 0.0
        self.actions: list[str] = []
        self._nonces: set[str] = set()
        self._faults: dict[str, list[str]] = {}
        self._behaviours = Queued()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return endpoint(self._server)

    # --- state, for tests and the lab ---------------------------------------------------

    def add_vpc(self, vpc_id: str, tables: int = 1) -> list[str]:
        """A VPC with its vRouter and ``tables`` route tables (each with the system entry of
        the VPC's vSwitch); returns the route table IDs."""
        with self._lock:
            suffix = uuid.uuid4().hex[:12]
            vrouter = f"vrt-{suffix}"
            ids = [f"vtb-{suffix}{n}" for n in range(tables)]
            self.vpcs[vpc_id], self.vrouters[vrouter] = vrouter, ids
            for table in ids:
                self.tables[table] = [self._entry(table, "192.168.0.0/24", "System", "", "")]
            return ids

    def add_entry(self, table: str, destination: str, instance_id: str,
                  entry_type: str = "Custom", next_hop_type: str = "Instance",
                  name: str = "") -> None:
        with self._lock:
            self.tables[table].append(self._entry(table, destination, entry_type, instance_id,
                                                  next_hop_type, name=name))

    def entries(self, table: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(entry) for entry in self.tables[table]]

    def delete_entry(self, table: str, destination: str) -> None:
        """Delete the entries to ``destination``, as an operator in the console does."""
        with self._lock:
            self.tables[table] = [e for e in self.tables[table]
                                  if e["DestinationCidrBlock"] != destination]

    def fail(self, action: str, code: str, times: int) -> None:
        with self._lock:
            self._faults.setdefault(action, []).extend([code] * times)

    def answer_with(self, action: str, behaviour: Behaviour, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``action`` (every one: None) with
        ``behaviour`` (``flannel_lab.hostile``: a broken or hostile server) instead."""
        with self._lock:
            self._behaviours.add(action, behaviour, times)

    def calm(self) -> None:
        with self._lock:
            self._behaviours.clear()

    @staticmethod
    def _entry(table: str, destination: str, entry_type: str, instance_id: str,
               next_hop_type: str, status: str = "Available", name: str = "",
               ) -> dict[str, Any]:
        return {"RouteTableId": table, "DestinationCidrBlock": destination, "Type": entry_type,
                "Status": status, "InstanceId": instance_id, "NextHopType": next_hop_type,
                "RouteEntryId": f"rte-{uuid.uuid4().hex[:12]}", "RouteEntryName": name,
                "NextHops": {"NextHop": []}}

    # --- the protocol -------------------------------------------------------------------

    def _verify(self, method: str, params: dict[str, str]) -> None:
        given = params.pop("Signature", "")
        self._required(params, "AccessKeyId", "SignatureNonce", "Timestamp", "SignatureMethod",
                       "SignatureVersion", "Version", "Action")
        secret = self.credentials.get(params["AccessKeyId"])
        if secret is None:
            raise ApiError("InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        if params["SignatureMethod"] != "HMAC-SHA1" or params["SignatureVersion"] != "1.0":
            raise ApiError("InvalidParameter", "The signature method or version is not "
                                               "supported.")
        try:
            stamp = timegm(time.strptime(params["Timestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        except ValueError:
            raise ApiError("InvalidTimeStamp.Format", "Specified time stamp or date value "
                                                      "is not well formatted.") from None
        if abs(time.time() - stamp) > 15 * 60:
            raise ApiError("InvalidTimeStamp.Expired", "Specified time stamp or date value is "
                                                       "expired.")
        canonical = "&".join(f"{_percent(k)}={_percent(v)}" for k, v in sorted(params.items()))
        to_sign = f"{method}&{_percent('/')}&{_percent(canonical)}"
        expected = base64.b64encode(hmac.new(f"{secret}&".encode(), to_sign.encode(),
                                             hashlib.sha1).digest()).decode()
        if not hmac.compare_digest(expected, given):
            raise ApiError("SignatureDoesNotMatch", "Specified signature is not matched with "
                                                    "our calculation.")
        with self._lock:
            if params["SignatureNonce"] in self._nonces:
                raise ApiError("SignatureNonceUsed", "Specified signature nonce was used "
                                                     "already.")
            self._nonces.add(params["SignatureNonce"])

    def _handle(self, method: str, params: dict[str, str]) -> dict[str, Any]:
        self._verify(method, params)
        action = params["Action"]
        self.actions.append(action)
        handler = {"DescribeVpcs": self._describe_vpcs,
                   "DescribeVRouters": self._describe_vrouters,
                   "DescribeRouteTables": self._describe_tables,
                   "CreateRouteEntry": self._create,
                   "DeleteRouteEntry": self._delete,
                   "ModifyRouteEntry": self._modify}.get(action)
        if handler is None:
            raise ApiError("InvalidAction.NotFound", "Specified api is not found, please check "
                                                     "your url and method.")
        if params["Version"] != VERSION:
            raise ApiError("InvalidVersion", "Specified parameter Version is not valid.")
        self._required(params, "RegionId")
        if params["RegionId"] != self.region:
            raise ApiError("InvalidRegionId.NotFound", "The specified region does not exist.")
        with self._lock:
            queued = self._faults.get(action)
            if queued:
                raise ApiError(queued.pop(0))
            return handler(params)

    @staticmethod
    def _required(params: dict[str, str], *names: str) -> None:
        for name in names:
            if not params.get(name):
                raise ApiError("MissingParameter", f"The input parameter \"{name}\" that is "
                               "mandatory for processing this request is not supplied.")

    def _describe_vpcs(self, params: dict[str, str]) -> dict[str, Any]:
        found = [{"VpcId": vpc, "VRouterId": vrouter, "RegionId": self.region,
                  "Status": "Available", "CidrBlock": "192.168.0.0/16", "IsDefault": False}
                 for vpc, vrouter in self.vpcs.items()
                 if params.get("VpcId") in (None, "", vpc)]
        return {"TotalCount": len(found), "PageNumber": 1, "PageSize": 10,
                "Vpcs": {"Vpc": found}}

    def _describe_vrouters(self, params: dict[str, str]) -> dict[str, Any]:
        found = [{"VRouterId": vrouter, "RegionId": self.region,
                  "VpcId": next(v for v, r in self.vpcs.items() if r == vrouter),
                  "RouteTableIds": {"RouteTableId": list(tables)}}
                 for vrouter, tables in self.vrouters.items()
                 if params.get("VRouterId") in (None, "", vrouter)]
        return {"TotalCount": len(found), "PageNumber": 1, "PageSize": 10,
                "VRouters": {"VRouter": found}}

    def _describe_tables(self, params: dict[str, str]) -> dict[str, Any]:
        found = []
        for table, entries in self.tables.items():
            vrouter = next(r for r, ids in self.vrouters.items() if table in ids)
            if params.get("RouteTableId") not in (None, "", table) or params.get(
                    "VRouterId") not in (None, "", vrouter):
                continue
            listed = [dict(entry) for entry in entries]
            for entry in entries:  # created in the background: done by the next look
                if entry["Status"] == "Pending":
                    entry["Status"] = "Available"
            found.append({"RouteTableId": table, "VRouterId": vrouter,
                          "RouteTableType": "System", "CreationTime": "2026-01-01T00:00:00Z",
                          "RouteEntrys": {"RouteEntry": listed}})
        return {"TotalCount": len(found), "PageNumber": 1, "PageSize": 10,
                "RouteTables": {"RouteTable": found}}

    def _table(self, params: dict[str, str]) -> list[dict[str, Any]]:
        self._required(params, "RouteTableId")
        if params["RouteTableId"] not in self.tables:
            raise ApiError("InvalidRouteTableId.NotFound", "The specified route table does "
                                                           "not exist.")
        return self.tables[params["RouteTableId"]]

    def _create(self, params: dict[str, str]) -> dict[str, Any]:
        entries = self._table(params)
        self._required(params, "DestinationCidrBlock", "NextHopType", "NextHopId")
        destination = params["DestinationCidrBlock"]
        if any(e["DestinationCidrBlock"] == destination for e in entries):
            raise ApiError("InvalidCIDRBlock.Duplicate", "Specified CIDR block is already "
                                                         "exists.")
        if params["NextHopType"] == "Instance" and params["NextHopId"] not in self.instances:
            raise ApiError("InvalidInstanceId.NotFound", "The specified instance does not "
                                                         "exist.")
        custom = sum(1 for e in entries if e["Type"] == "Custom")
        if self.entry_limit is not None and custom >= self.entry_limit:
            raise ApiError("QuotaExceeded")
        name = params.get("RouteEntryName", "")
        self._check_name(name)
        entry = self._entry(params["RouteTableId"], destination, "Custom", params["NextHopId"],
                            params["NextHopType"], status="Pending", name=name)
        entries.append(entry)
        return {"RouteEntryId": entry["RouteEntryId"]}

    @staticmethod
    def _check_name(name: str) -> None:
        if len(name) > 128 or name.startswith(("http://", "https://")):
            raise ApiError("IllegalParam.Name", "The specified name is invalid.")

    def _modify(self, params: dict[str, str]) -> dict[str, Any]:
        self._required(params, "RouteEntryId")
        name = params.get("RouteEntryName", "")
        self._check_name(name)
        for entries in self.tables.values():
            for entry in entries:
                if entry["RouteEntryId"] == params["RouteEntryId"]:
                    if "RouteEntryName" in params:
                        entry["RouteEntryName"] = name
                    return {}
        raise ApiError("InvalidRouteEntryId.NotFound", "The specified route entry does not "
                                                       "exist.")

    def _delete(self, params: dict[str, str]) -> dict[str, Any]:
        entries = self._table(params)
        self._required(params, "DestinationCidrBlock")
        for entry in entries:
            if entry["DestinationCidrBlock"] == params["DestinationCidrBlock"] and params.get(
                    "NextHopId") in (None, "", entry["InstanceId"]) and entry["Type"] == "Custom":
                entries.remove(entry)
                return {}
        raise ApiError("InvalidRouteEntry.NotFound", "The specified route entry does not "
                                                     "exist.")

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> FakeAliyunVpc:
        """Serve on ``address`` (a free port) in ``host``'s network namespace."""
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _serve(self, method: str, query: str) -> None:
                if double.delay:
                    time.sleep(double.delay)
                with double._lock:
                    behaviour = double._behaviours.take(
                        dict(parse_qsl(query)).get("Action", ""))
                if behaviour is not None:
                    return behaviour(self)
                request_id = str(uuid.uuid4()).upper()
                status = 200
                try:
                    params = dict(parse_qsl(query, keep_blank_values=True))
                    answer = double._handle(method, params)
                except ApiError as error:
                    status = _STATUS.get(error.code, 400)
                    answer = {"Code": error.code, "Message": error.message,
                              "HostId": f"vpc.{double.region}.aliyuncs.com",
                              "Recommend": f"https://api.aliyun.com/troubleshoot?q={error.code}"}
                answer["RequestId"] = request_id
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json;charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout test)

            def do_GET(self) -> None:
                self._serve("GET", urlsplit(self.path).query)

            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length", "0") or 0), 1 << 20)
                self._serve("POST", self.rfile.read(length).decode("utf-8", "replace"))

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)


class FakeAliyunMetadata(TokenMetadata):
    token_header = "X-aliyun-ecs-metadata-token"  # noqa: S105 - a header name

    def __init__(self, by_client: dict[str, dict[str, str]], enforced: bool = False) -> None:
        super().__init__()
        self.by_client = by_client  # source address -> path -> value; may grow while served
        self.enforced = enforced

    def _get_refused(self, token: str | None) -> int | None:
        if token is not None and token not in self.tokens:
            return 401
        return 403 if token is None and self.enforced else None

    def _paths(self, client: str) -> dict[str, str]:
        return self.by_client.get(client, {})
