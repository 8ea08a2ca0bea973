"""A fake cloud instance metadata service (AWS IMDS, Tencent's metadata), served to the
lab's nodes and used by the tests (there is no real one off the cloud).

It models what the engines read: ``GET /latest/meta-data/<path>`` answering the text of
``paths[<path>]`` (404 for anything else), and for AWS's IMDSv2 ``PUT /latest/api/token``
with the ``X-aws-ec2-metadata-token-ttl-seconds`` header (1..21600, else 400) issuing a
token that GETs carry in ``X-aws-ec2-metadata-token``. Modes: ``"optional"`` (IMDSv2 with
v1 still allowed: a GET without a token is served, one with an unknown token gets 401, as
AWS does), ``"required"`` (a GET without a valid token gets 401), ``"v1-only"`` (the token
PUT gets 403, as when IMDSv2 is unavailable). ``expire_tokens()`` invalidates every token
issued so far; ``answer_with(path, behaviour)`` answers a path with a broken or hostile
answer (``flannel_lab.hostile``). Not modelled: token TTL expiry by time, hop limits, the
dynamic/ and user-data/ trees. Requests are recorded in ``requests`` (method, path, had a
token).
``TokenMetadata`` is the frame it shares with Alibaba Cloud's metadata double
(``flannel_lab.aliyunapi``): the same paths and token dance, other headers and refusals.
"""

from __future__ import annotations

import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from flannel.kernel.host import LOCAL, Host
from flannel_lab.hostile import Behaviour, Queued
from flannel_lab.served import endpoint, serve, shut


class TokenMetadata:
    """What AWS's IMDS and Alibaba Cloud's metadata service share: ``GET
    /latest/meta-data/<path>``, and ``PUT /latest/api/token`` with ``<token_header>-ttl-seconds``
    (1..21600, else 400) issuing a token that GETs carry in ``<token_header>``. Subclasses
    say which requests they refuse and which paths a client sees."""

    token_header = ""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, bool]] = []
        self._behaviours = Queued()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def answer_with(self, path: str, behaviour: Behaviour, times: int | None = 1) -> None:
        """Answer the next ``times`` requests of ``path`` (``/latest/...``; every one: None)
        with ``behaviour`` (``flannel_lab.hostile``) instead."""
        with self._lock:
            self._behaviours.add(path, behaviour, times)

    def _behaviour(self, path: str) -> Behaviour | None:
        with self._lock:
            return self._behaviours.take(path)

    @property
    def url(self) -> str:
        return f"http://{endpoint(self._server)}"

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def _put_refused(self) -> int | None:
        """The status a token request gets instead of a token, if any."""
        return None

    def _get_refused(self, token: str | None) -> int | None:
        """The status a GET with ``token`` (None: none sent) gets instead of an answer."""
        raise NotImplementedError

    def _paths(self, client: str) -> dict[str, str]:
        """The tree the client at address ``client`` sees."""
        raise NotImplementedError

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> Self:
        """Serve on ``address`` (a free port) in ``host``'s network namespace."""
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                double.requests.append(("PUT", self.path, False))
                behaviour = double._behaviour(self.path)
                if behaviour is not None:
                    return behaviour(self)
                if self.path != "/latest/api/token":
                    return self._answer(404)
                refused = double._put_refused()
                if refused is not None:
                    return self._answer(refused)
                ttl = self.headers.get(f"{double.token_header}-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400)
                token = secrets.token_urlsafe(24)
                double.tokens.add(token)
                return self._answer(200, token)

            def do_GET(self) -> None:
                token = self.headers.get(double.token_header)
                double.requests.append(("GET", self.path, token is not None))
                behaviour = double._behaviour(self.path)
                if behaviour is not None:
                    return behaviour(self)
                refused = double._get_refused(token)
                if refused is not None:
                    return self._answer(refused)
                paths = double._paths(self.client_address[0])
                prefix = "/latest/meta-data/"
                value = paths.get(self.path[len(prefix):]) if self.path.startswith(
                    prefix) else None
                return self._answer(404) if value is None else self._answer(200, value)

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)


class FakeMetadata(TokenMetadata):
    token_header = "X-aws-ec2-metadata-token"  # noqa: S105 - a header name

    def __init__(self, paths: dict[str, str], mode: str = "optional") -> None:
        assert mode in ("optional", "required", "v1-only")
        super().__init__()
        self.paths = dict(paths)
        self.mode = mode

    def _put_refused(self) -> int | None:
        return 403 if self.mode == "v1-only" else None

    def _get_refused(self, token: str | None) -> int | None:
        if self.mode == "v1-only":
            return None
        if token is not None and token not in self.tokens:
            return 401
        return 401 if token is None and self.mode == "required" else None

    def _paths(self, client: str) -> dict[str, str]:
        return self.paths


def aws_paths(instance_id: str, region: str, interfaces: list[dict[str, str]]) -> dict[str, str]:
    """The IMDS tree of an instance; each interface has mac, ip, eni, subnet, vpc."""
    paths = {"instance-id": instance_id, "placement/region": region,
             "mac": interfaces[0]["mac"],
             "network/interfaces/macs/": "\n".join(f"{i['mac']}/" for i in interfaces)}
    for interface in interfaces:
        base = f"network/interfaces/macs/{interface['mac']}"
        paths[f"{base}/local-ipv4s"] = interface["ip"]
        paths[f"{base}/interface-id"] = interface["eni"]
        paths[f"{base}/subnet-id"] = interface["subnet"]
        paths[f"{base}/vpc-id"] = interface["vpc"]
    return paths
