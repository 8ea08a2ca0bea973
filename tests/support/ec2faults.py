"""moto's EC2 server on loopback, and a relay in front of it that adds what moto does not
model, the way EC2 does it.

moto (a real implementation of the EC2 query API, run in-process by ``ThreadedMotoServer``)
keeps the VPCs, ENIs, instances and route tables. The relay forwards every request to it
unchanged and can:

- answer the next N requests for an action with an EC2 error document
  (``<Response><Errors><Error><Code>..``), e.g. ``RequestLimitExceeded`` with HTTP 503, as EC2
  throttles (``fail``);
- enforce the per-table route quota: ``CreateRoute`` into a table that already holds
  ``route_limit`` routes gets ``RouteLimitExceeded`` (HTTP 400), as EC2 does (moto has no
  quota) - the count comes from moto itself;
- report routes whose target (ENI or instance) is in ``gone_targets`` with state
  ``blackhole``, as EC2 does once the target is deleted (moto reports every route active);
- answer an action as a broken or compromised server would (``answer_with``, a behaviour of
  ``flannel_lab.hostile``: a dripping, huge or redirecting answer).

It records each action it saw in ``actions``. Not modelled: signatures (moto ignores them).
"""

from __future__ import annotations

import http.client
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from moto.server import ThreadedMotoServer

from flannel.kernel.host import LOCAL, Host
from flannel_lab.hostile import Behaviour, Queued
from flannel_lab.served import endpoint, serve, shut


def _local(tag: str) -> str:
    """An element's name without its namespace (moto's responses may carry one or none)."""
    return tag.rsplit("}", 1)[-1]


def _route_items(root: ET.Element) -> list[ET.Element]:
    return [item for route_set in root.iter() if _local(route_set.tag) == "routeSet"
            for item in route_set if _local(item.tag) == "item"]


def _error_document(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}'
            f"</Code><Message>{message}</Message></Error></Errors>"
            "<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>").encode()


class Ec2Relay:
    def __init__(self) -> None:
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.actions: list[str] = []
        self.route_limit: int | None = None
        self.gone_targets: set[str] = set()
        self._faults: dict[str, list[tuple[int, str, str]]] = {}
        self._behaviours = Queued()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{endpoint(self._server)}"

    def fail(self, action: str, code: str, times: int, status: int = 400,
             message: str = "injected") -> None:
        with self._lock:
            self._faults.setdefault(action, []).extend([(status, code, message)] * times)

    def answer_with(self, action: str, behaviour: Behaviour, times: int | None = 1) -> None:
        """The next ``times`` requests for ``action`` (every one: None) get ``behaviour``."""
        with self._lock:
            self._behaviours.add(action, behaviour, times)

    def reset(self) -> None:
        """Forget every fault, behaviour, quota and gone target (moto's state stays: tests
        that share a relay each make their own VPC)."""
        with self._lock:
            self._faults.clear()
            self._behaviours.clear()
        self.actions.clear()
        self.route_limit = None
        self.gone_targets.clear()

    def count(self, action: str) -> int:
        return self.actions.count(action)

    def _upstream(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        port = self.moto.get_host_and_port()[1]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("POST", "/", body=body, headers=headers)
            response = connection.getresponse()
            return (response.status, response.read(),
                    response.getheader("Content-Type", "text/xml"))
        finally:
            connection.close()

    def _routes_in(self, table: str, headers: dict[str, str]) -> int:
        body = f"Action=DescribeRouteTables&Version=2016-11-15&RouteTableId.1={table}".encode()
        _, answer, _ = self._upstream(body, headers)
        return len(_route_items(ET.fromstring(answer)))  # noqa: S314 - moto, on loopback

    def _blackholes(self, answer: bytes) -> bytes:
        root = ET.fromstring(answer)  # noqa: S314 - moto, on loopback
        namespace = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""
        ET.register_namespace("", namespace)
        for item in _route_items(root):
            fields = {_local(element.tag): element for element in item}
            targets = {fields[name].text for name in ("networkInterfaceId", "instanceId")
                       if name in fields}
            if targets & self.gone_targets and "state" in fields:
                fields["state"].text = "blackhole"
        return ET.tostring(root, xml_declaration=True, encoding="utf-8")

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> Ec2Relay:
        """Serve on ``address`` (a free port) in ``host``'s network namespace."""
        self.moto.start()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                form = parse_qs(body.decode())
                action = form.get("Action", [""])[0]
                relay.actions.append(action)
                headers = {name: value for name, value in self.headers.items()
                           if name.lower() not in ("host", "content-length")}
                with relay._lock:
                    behaviour = relay._behaviours.take(action)
                    queued = relay._faults.get(action)
                    fault = queued.pop(0) if queued and behaviour is None else None
                if behaviour is not None:
                    return behaviour(self)
                if fault is not None:
                    status, code, message = fault
                    return self._send(status, _error_document(code, message), "text/xml")
                if action == "CreateRoute" and relay.route_limit is not None:
                    table = form.get("RouteTableId", [""])[0]
                    if relay._routes_in(table, headers) >= relay.route_limit:
                        return self._send(400, _error_document(
                            "RouteLimitExceeded",
                            f"The maximum number of routes has been reached for {table}."),
                            "text/xml")
                status, answer, content_type = relay._upstream(body, headers)
                if action == "DescribeRouteTables" and status == 200 and relay.gone_targets:
                    answer = relay._blackholes(answer)
                return self._send(status, answer, content_type)

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)
        self.moto.stop()
