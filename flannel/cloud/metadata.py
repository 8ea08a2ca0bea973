"""Instance metadata readers: AWS's IMDS (v2 with a session token, falling back to v1),
Tencent Cloud's and Alibaba Cloud's metadata services, and the node identity each engine
needs from them.

Values read here are untrusted: every answer is bounded in size and time
(``flannel.clients.fetch``; a redirect is refused, so the session token never reaches another
host), and every value checked against the shape the cloud documents before use.
Must not touch: cloud APIs, credentials.
"""

from __future__ import annotations

import logging
import re
import urllib.request
from dataclasses import dataclass
from ipaddress import IPv4Address

from flannel.clients.fetch import FetchFailed, TooLarge, fetch, opener
from flannel.cloud.base import CloudError, Stopped, Stopper

log = logging.getLogger(__name__)

AWS_IMDS = "http://169.254.169.254"
TENCENT_METADATA = "http://metadata.tencentyun.com"
ALIYUN_METADATA = "http://100.100.100.200"
_MAX_BODY = 64 * 1024
_SESSION_TTL_SECONDS = "21600"

_AWS_SHAPES = {
    "instance-id": re.compile(r"i-[0-9a-f]{8,32}", re.ASCII),
    "placement/region": re.compile(r"[a-z]{2}(-[a-z0-9]+)+-\d{1,2}", re.ASCII),
    "interface-id": re.compile(r"eni-[0-9a-f]{8,32}", re.ASCII),
    "subnet-id": re.compile(r"subnet-[0-9a-f]{8,32}", re.ASCII),
    "vpc-id": re.compile(r"vpc-[0-9a-f]{8,32}", re.ASCII),
}
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", re.ASCII)
# Tencent's and Alibaba's region names have the same shape (ap-guangzhou, cn-hangzhou).
_REGION = re.compile(r"[a-z]{2,}(-[a-z0-9]+){1,3}", re.ASCII)
_TENCENT_VPC = re.compile(r"vpc-[0-9a-z]{4,32}", re.ASCII)
_ALIYUN_SHAPES = {
    "region-id": _REGION,
    "instance-id": re.compile(r"i-[0-9a-z]{8,32}", re.ASCII),
    "vpc-id": re.compile(r"vpc-[0-9a-z]{8,32}", re.ASCII),
}


@dataclass(frozen=True)
class TokenScheme:
    """How a metadata service hands out session tokens: the header asking for one (with its
    lifetime) and the header carrying it, and what the log calls the two modes."""

    ttl_header: str
    token_header: str
    with_token: str
    without_token: str


#: AWS's IMDSv2 (and IMDSv1 without a token).
AWS_TOKENS = TokenScheme("X-aws-ec2-metadata-token-ttl-seconds", "X-aws-ec2-metadata-token",
                         "IMDSv2", "IMDSv1")
#: Alibaba Cloud's hardened mode (and its normal mode without a token).
ALIYUN_TOKENS = TokenScheme("X-aliyun-ecs-metadata-token-ttl-seconds",
                            "X-aliyun-ecs-metadata-token", "hardened mode", "normal mode")


class MetadataClient:
    """GETs under ``<base>/latest/meta-data/``; with ``token=True`` asks for a session token
    first (``scheme``: AWS's IMDSv2 unless told otherwise).

    A session token from ``PUT /latest/api/token`` is sent with every GET and refreshed once
    when the service answers 401. If the token request is refused (403, 404, 405) or times
    out (the hop limit of 1 drops it inside containers), the client falls back to plain GETs
    (IMDSv1) and says so once.
    """

    def __init__(self, base_url: str, token: bool, timeout: float = 2.0,
                 scheme: TokenScheme = AWS_TOKENS, stopper: Stopper | None = None) -> None:
        if not base_url.startswith("http://"):
            raise CloudError(f"the metadata service address must be an http:// URL, "
                             f"not {base_url[:80]!r}")
        self.base_url = base_url.rstrip("/")
        self.use_token = token
        self.timeout = timeout
        self.scheme = scheme
        #: Cuts a read in flight when flanneld stops (the engine shares it).
        self.stopper = stopper or Stopper()
        self._token: str | None = None
        self._v1 = not token
        # Metadata is link-local: never send it through an HTTP proxy from the environment.
        self._opener = opener(proxies=False)

    def _open(self, request: urllib.request.Request) -> tuple[int, str]:
        what = f"the instance metadata service at {self.base_url}"
        try:
            reply = fetch(self._opener, request, timeout=self.timeout, max_bytes=_MAX_BODY,
                          stopper=self.stopper, what=what)
        except TooLarge as error:
            raise CloudError(f"{what} sent {error}; refusing it") from None
        except FetchFailed as error:
            raise CloudError(
                f"{what} did not answer ({error}); is this node running on the cloud its "
                "backend is for?") from None
        if 300 <= reply.status < 400:
            # Never followed: the session token must not reach another host.
            raise CloudError(f"{what} answered HTTP {reply.status}, a redirect; not "
                             "followed (a metadata service never redirects)")
        return reply.status, (reply.body.decode("utf-8", "replace").strip()
                              if reply.status == 200 else "")

    def _fetch_token(self) -> None:
        request = urllib.request.Request(  # noqa: S310 (http:// checked in __init__)
            f"{self.base_url}/latest/api/token", method="PUT",
            headers={self.scheme.ttl_header: _SESSION_TTL_SECONDS})
        try:
            status, body = self._open(request)
        except Stopped:
            raise
        except CloudError:
            status, body = 0, ""
        if status == 200 and 0 < len(body) <= 1024 and body.isascii() and body.isprintable():
            self._token = body
            return
        self._v1 = True
        log.warning("%s token request to %s failed (%s); falling back to %s",
                    self.scheme.with_token, self.base_url,
                    f"HTTP {status}" if status else "no answer", self.scheme.without_token)

    def _get_once(self, path: str) -> tuple[int, str]:
        headers = {} if self._v1 else {self.scheme.token_header: self._token or ""}
        url = f"{self.base_url}/latest/meta-data/{path}"
        return self._open(urllib.request.Request(url, headers=headers))  # noqa: S310

    def get(self, path: str) -> str:
        if not self._v1 and self._token is None:
            self._fetch_token()
        status, body = self._get_once(path)
        if status == 401 and not self._v1:
            # The token expired (or the service restarted): one fresh token, one more try.
            self._token = None
            self._fetch_token()
            status, body = self._get_once(path)
        if status != 200:
            raise CloudError(f"instance metadata {path}: HTTP {status} from {self.base_url}")
        return body


def checked(path: str, value: str, shape: re.Pattern[str],
            source: str = "instance metadata") -> str:
    """``value``, read at ``path`` of ``source``, if it has the shape expected there."""
    if not shape.fullmatch(value):
        raise CloudError(f"{source} {path}: unexpected value {value[:80]!r}")
    return value


@dataclass(frozen=True)
class AwsIdentity:
    instance_id: str
    region: str
    eni_id: str
    subnet_id: str
    vpc_id: str


def aws_identity(client: MetadataClient, address: IPv4Address) -> AwsIdentity:
    """The instance, its region, and the ENI (with its subnet and VPC) holding ``address``."""
    instance_id = checked("instance-id", client.get("instance-id"), _AWS_SHAPES["instance-id"])
    region = checked("placement/region", client.get("placement/region"),
                      _AWS_SHAPES["placement/region"])
    macs = [line.strip().rstrip("/") for line in
            client.get("network/interfaces/macs/").splitlines()[:64]]
    for mac in macs:
        if not _MAC.fullmatch(mac):
            continue
        base = f"network/interfaces/macs/{mac}"
        addresses = client.get(f"{base}/local-ipv4s").split()
        if str(address) not in addresses:
            continue
        fields = {name: checked(f"{base}/{name}", client.get(f"{base}/{name}"),
                                 _AWS_SHAPES[name])
                  for name in ("interface-id", "subnet-id", "vpc-id")}
        return AwsIdentity(instance_id, region, fields["interface-id"], fields["subnet-id"],
                           fields["vpc-id"])
    raise CloudError(
        f"no network interface of instance {instance_id} holds the external address "
        f"{address}; choose the interface attached to the VPC with --iface or --iface-regex")


@dataclass(frozen=True)
class TencentIdentity:
    region: str
    vpc_id: str


def tencent_identity(client: MetadataClient) -> TencentIdentity:
    """The region and VPC of this CVM, as Go flannel reads them (primary MAC's VPC)."""
    region = checked("placement/region", client.get("placement/region"), _REGION)
    mac = checked("mac", client.get("mac").lower(), _MAC)
    vpc_path = f"network/interfaces/macs/{mac}/vpc-id"
    return TencentIdentity(region, checked(vpc_path, client.get(vpc_path), _TENCENT_VPC))


@dataclass(frozen=True)
class AliyunIdentity:
    region: str
    instance_id: str
    vpc_id: str


def aliyun_identity(client: MetadataClient) -> AliyunIdentity:
    """The region, instance and VPC of this ECS instance, the three values Go flannel read."""
    region, instance_id, vpc_id = (checked(path, client.get(path), _ALIYUN_SHAPES[path])
                                   for path in ("region-id", "instance-id", "vpc-id"))
    return AliyunIdentity(region, instance_id, vpc_id)
