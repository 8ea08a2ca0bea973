"""A test double of Tencent Cloud's VPC API (version 2017-03-12), for the four actions the
tencent-vpc engine uses. There is no emulator of Tencent Cloud to run here.

It speaks the documented protocol: ``POST /`` with a JSON body, the action, version, region
and timestamp in ``X-TC-Action``/``X-TC-Version``/``X-TC-Region``/``X-TC-Timestamp``, and a
TC3-HMAC-SHA256 ``Authorization`` header that it verifies against the secret of the key ID
(``AuthFailure.SecretIdNotFound``, ``AuthFailure.SignatureFailure``,
``AuthFailure.SignatureExpire`` past 5 minutes). Every answer is ``{"Response": {...,
"RequestId"}}``; errors are ``{"Response": {"Error": {"Code", "Message"}, "RequestId"}}``
with the documented common codes (``InvalidAction``, ``NoSuchVersion``, ``MissingParameter``,
``InvalidParameter``, ``RequestLimitExceeded``) and the actions' own (``ResourceNotFound``,
``InvalidRouteId.NotFound``, ``InvalidParameterValue.Duplicate``, ``LimitExceeded``).

Modelled actions: ``DescribeRouteTables`` (``RouteTableIds``, ``Filters`` on ``vpc-id`` and
``route-table-id``), ``CreateRoutes``, ``DeleteRoutes`` (by ``RouteId``), ``ReplaceRoutes``;
route objects carry ``RouteId``, ``DestinationCidrBlock``, ``GatewayType``, ``GatewayId``,
``Enabled``, ``RouteType``, ``RouteTableId``, ``RouteDescription`` (set by ``CreateRoutes``
and ``ReplaceRoutes``, empty when not given). ``route_limit`` caps the
routes per table (``LimitExceeded``); ``fail(action, code, times)`` queues errors;
``answer_with(action, behaviour)`` answers as a broken or compromised server would (a
behaviour of ``flannel_lab.hostile``: dripping, huge, redirecting). Not
modelled: other actions, pagination beyond one page, route conflict checks other than an
identical destination, CAM policies.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flannel.kernel.host import LOCAL, Host
from flannel_lab.hostile import Behaviour, Queued
from flannel_lab.served import endpoint, serve, shut

VERSION = "2017-03-12"


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class FakeTencentVpc:
    def __init__(self, credentials: dict[str, str]) -> None:
        self.credentials = dict(credentials)
        self.tables: list[dict[str, Any]] = []
        self.route_limit: int | None = None
        self.actions: list[str] = []
        self._faults: dict[str, list[str]] = {}
        self._behaviours = Queued()
        self._next_route = 1000
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return endpoint(self._server)

    # --- state, for tests --------------------------------------------------------------

    def add_table(self, vpc_id: str, main: bool = False) -> str:
        table_id = f"rtb-{uuid.uuid4().hex[:8]}"
        self.tables.append({"VpcId": vpc_id, "RouteTableId": table_id,
                            "RouteTableName": table_id, "AssociationSet": [], "RouteSet": [],
                            "Main": main, "CreatedTime": "2026-01-01 00:00:00",
                            "TagSet": [], "LocalCidrForCcn": []})
        return table_id

    def add_route(self, table_id: str, destination: str, gateway_type: str, gateway_id: str,
                  enabled: bool = True, route_type: str = "USER", description: str = "",
                  ) -> int:
        with self._lock:
            return self._add(self._table(table_id), {
                "DestinationCidrBlock": destination, "GatewayType": gateway_type,
                "GatewayId": gateway_id, "Enabled": enabled,
                "RouteDescription": description}, route_type)["RouteId"]

    def routes(self, table_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(route) for route in self._table(table_id)["RouteSet"]]

    def delete_route(self, table_id: str, destination: str) -> None:
        """Delete the routes to ``destination``, as an operator in the console does."""
        with self._lock:
            table = self._table(table_id)
            table["RouteSet"] = [r for r in table["RouteSet"]
                                 if r["DestinationCidrBlock"] != destination]

    def fail(self, action: str, code: str, times: int) -> None:
        with self._lock:
            self._faults.setdefault(action, []).extend([code] * times)

    def answer_with(self, action: str, behaviour: Behaviour, times: int | None = 1) -> None:
        """The next ``times`` requests for ``action`` (every one: None) get ``behaviour``."""
        with self._lock:
            self._behaviours.add(action, behaviour, times)

    # --- the protocol ------------------------------------------------------------------

    def _table(self, table_id: Any) -> dict[str, Any]:
        for table in self.tables:
            if table["RouteTableId"] == table_id:
                return table
        raise ApiError("ResourceNotFound", f"The specified RouteTableId `{table_id}` is not "
                                           "found")

    def _add(self, table: dict[str, Any], spec: dict[str, Any], route_type: str = "USER"
             ) -> dict[str, Any]:
        self._next_route += 1
        route = {"RouteId": self._next_route, "RouteItemId": f"rti-{self._next_route}",
                 "DestinationCidrBlock": spec["DestinationCidrBlock"],
                 "GatewayType": spec["GatewayType"], "GatewayId": spec["GatewayId"],
                 "Enabled": bool(spec.get("Enabled", True)), "RouteType": route_type,
                 "RouteTableId": table["RouteTableId"],
                 "RouteDescription": spec.get("RouteDescription", ""),
                 "DestinationIpv6CidrBlock": "", "PublishedToVbc": False,
                 "CreatedTime": "2026-01-01 00:00:00"}
        table["RouteSet"].append(route)
        return route

    def _verify(self, headers: Any, body: bytes) -> None:
        auth = headers.get("Authorization", "")
        prefix = "TC3-HMAC-SHA256 "
        if not auth.startswith(prefix):
            raise ApiError("AuthFailure.SignatureFailure", "The provided credentials could not "
                                                           "be validated.")
        fields = dict(part.strip().split("=", 1) for part in auth[len(prefix):].split(","))
        secret_id, date, service, terminator = fields["Credential"].split("/")
        if secret_id not in self.credentials:
            raise ApiError("AuthFailure.SecretIdNotFound", "The SecretId is not found.")
        timestamp = headers.get("X-TC-Timestamp", "")
        if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
            raise ApiError("AuthFailure.SignatureExpire", "The signature has expired.")
        signed = fields["SignedHeaders"]
        canonical_headers = "".join(f"{name}:{headers.get(name, '').strip().lower()}\n"
                                    for name in signed.split(";"))
        canonical = "\n".join(["POST", "/", "", canonical_headers, signed,
                               hashlib.sha256(body).hexdigest()])
        scope = f"{date}/{service}/{terminator}"
        to_sign = "\n".join(["TC3-HMAC-SHA256", timestamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = _hmac(_hmac(_hmac(("TC3" + self.credentials[secret_id]).encode(), date),
                          service), "tc3_request")
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if service != "vpc" or not hmac.compare_digest(expected, fields.get("Signature", "")):
            raise ApiError("AuthFailure.SignatureFailure", "The provided credentials could not "
                                                           "be validated.")

    def _handle(self, headers: Any, body: bytes) -> dict[str, Any]:
        self._verify(headers, body)
        action = headers.get("X-TC-Action", "")
        self.actions.append(action)
        handler = {"DescribeRouteTables": self._describe, "CreateRoutes": self._create,
                   "DeleteRoutes": self._delete, "ReplaceRoutes": self._replace}.get(action)
        if handler is None:
            raise ApiError("InvalidAction", f"The action `{action}` is not supported.")
        if headers.get("X-TC-Version") != VERSION:
            raise ApiError("NoSuchVersion", "The API version does not exist.")
        if not headers.get("X-TC-Region"):
            raise ApiError("MissingParameter", "The request is missing a required parameter "
                                               "`Region`.")
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            raise ApiError("InvalidParameter", "The request body is not JSON.") from None
        with self._lock:
            queued = self._faults.get(action)
            if queued:
                code = queued.pop(0)
                raise ApiError(code, f"injected {code}")
            return handler(params)

    @staticmethod
    def _required(params: dict[str, Any], *names: str) -> None:
        for name in names:
            if name not in params:
                raise ApiError("MissingParameter", f"The request is missing a required "
                                                   f"parameter `{name}`.")

    def _describe(self, params: dict[str, Any]) -> dict[str, Any]:
        tables = self.tables
        if "RouteTableIds" in params:
            tables = [t for t in tables if t["RouteTableId"] in params["RouteTableIds"]]
        for flt in params.get("Filters", []):
            field = {"vpc-id": "VpcId", "route-table-id": "RouteTableId"}.get(flt.get("Name"))
            if field is None:
                raise ApiError("InvalidParameter", f"Filter name `{flt.get('Name')}` is "
                                                   "not supported.")
            tables = [t for t in tables if t[field] in flt.get("Values", [])]
        return {"TotalCount": len(tables), "RouteTableSet": json.loads(json.dumps(tables))}

    def _create(self, params: dict[str, Any]) -> dict[str, Any]:
        self._required(params, "RouteTableId", "Routes")
        table = self._table(params["RouteTableId"])
        for spec in params["Routes"]:
            self._required(spec, "DestinationCidrBlock", "GatewayType", "GatewayId")
            if any(r["DestinationCidrBlock"] == spec["DestinationCidrBlock"] and r["Enabled"]
                   for r in table["RouteSet"]):
                raise ApiError("InvalidParameterValue.Duplicate",
                               f"The destination `{spec['DestinationCidrBlock']}` already "
                               "has a route.")
            if self.route_limit is not None and len(table["RouteSet"]) >= self.route_limit:
                raise ApiError("LimitExceeded", "The route table has reached its route quota.")
            self._add(table, spec)
        return {"TotalCount": 1, "RouteTableSet": [json.loads(json.dumps(table))]}

    def _find_route(self, table: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        self._required(spec, "RouteId")
        for route in table["RouteSet"]:
            if route["RouteId"] == spec["RouteId"]:
                return route
        raise ApiError("InvalidRouteId.NotFound", f"The route `{spec['RouteId']}` is not "
                                                  "found.")

    def _delete(self, params: dict[str, Any]) -> dict[str, Any]:
        self._required(params, "RouteTableId", "Routes")
        table = self._table(params["RouteTableId"])
        doomed = [self._find_route(table, spec) for spec in params["Routes"]]
        table["RouteSet"] = [r for r in table["RouteSet"] if r not in doomed]
        return {"RouteSet": doomed}

    def _replace(self, params: dict[str, Any]) -> dict[str, Any]:
        self._required(params, "RouteTableId", "Routes")
        table = self._table(params["RouteTableId"])
        old, new = [], []
        for spec in params["Routes"]:
            self._required(spec, "DestinationCidrBlock", "GatewayType", "GatewayId")
            route = self._find_route(table, spec)
            old.append(dict(route))
            route.update(DestinationCidrBlock=spec["DestinationCidrBlock"],
                         GatewayType=spec["GatewayType"], GatewayId=spec["GatewayId"],
                         RouteDescription=spec.get("RouteDescription", ""), Enabled=True)
            new.append(dict(route))
        return {"OldRouteSet": old, "NewRouteSet": new}

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> FakeTencentVpc:
        """Serve on ``address`` (a free port) in ``host``'s network namespace."""
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                action = self.headers.get("X-TC-Action", "")
                with double._lock:
                    behaviour = double._behaviours.take(action)
                if behaviour is not None:
                    double.actions.append(action)
                    return behaviour(self)
                request_id = str(uuid.uuid4())
                try:
                    answer = double._handle(self.headers, body)
                except ApiError as error:
                    answer = {"Error": {"Code": error.code, "Message": error.message}}
                answer["RequestId"] = request_id
                data = json.dumps({"Response": answer}).encode()
                self.send_response(200)  # the API reports errors in the body, with HTTP 200
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)
