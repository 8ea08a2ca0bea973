"""Fuzz targets for what each backend decodes: its options in the network config's
``Backend`` object, and the ``BackendData`` a peer publishes in its lease.

Backend options: the real parser of every backend (vxlan, udp, ipip, wireguard, extension,
aws-vpc, tencent-vpc, ali-vpc, gce) fed an object whose members are that backend's fields in
any case with hostile values. Peer data: the real decoders the backends apply to a remote
lease (vxlan's
``VtepMAC``, wireguard's ``PublicKey``/``Port``, extension's string) fed a value that reached
us either inside an etcd lease value or as a raw annotation string. ``run`` returns on
acceptance or on the designed refusal and checks what an accepted input promises; anything
else that escapes is a crash.
"""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address
from typing import Any

from hypothesis import strategies as st

from flannel.backend.base import BackendConfigError
from flannel.backend.ipip import IpipConfig
from flannel.backend.udp import UdpConfig
from flannel.backend.vxlan import VxlanConfig, peer_mac
from flannel.backend.wireguard import WireguardBackend
from flannel.cloud.alivpc import AliVpcConfig
from flannel.cloud.awsvpc import AwsVpcConfig
from flannel.cloud.gce import GceConfig
from flannel.cloud.tencentvpc import TencentVpcConfig
from flannel.config import ConfigError, parse_config
from flannel.extension.peers import ExtensionConfig, peer_stdin
from flannel.kernel.rtnl import mac_bytes
from flannel.lease import Lease, LeaseAttrs, LeaseDecodeError
from flannel.wireguard.config import DeviceLayout, WireguardConfig, decode_lease_data
from flannel.wireguard.keys import parse_key
from flannel.wireguard.peers import LocalEndpoints, desired_peers
from tests.support.fuzz_store import (
    case_variants,
    deep,
    huge_numbers,
    json_values,
    numbers,
    odd_strings,
    render,
)
from tests.support.fuzzing import FuzzTarget

_KEY = "YAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
ports = st.one_of(numbers, st.sampled_from([0, 1, 8285, 8472, 51820, 65535, 65536, -1]))


def _key_options(key_id: str, endpoint: str, metadata: str
                 ) -> dict[str, st.SearchStrategy[Any]]:
    """The options of the access-key engines (ali-vpc, tencent-vpc; one parser reads them):
    their own plausible values, and URLs that are not bare ``scheme://host[:port]``."""
    return {"AccessKeyID": st.one_of(odd_strings, st.just(key_id)),
            "AccessKeySecret": st.one_of(odd_strings, numbers, st.just("secret")),
            "Endpoint": st.sampled_from(["", endpoint, "ftp://x", "http://u@h/",
                                         "https://h:99999", "https://h:port",
                                         "https://h/?Action=x", "http://[::1"]),
            "MetadataURL": st.one_of(odd_strings, st.just(metadata))}


FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "vxlan": {"VNI": numbers, "Port": ports, "MTU": numbers, "GBP": st.booleans(),
              "Learning": st.booleans(), "DirectRouting": st.booleans()},
    "udp": {"Port": ports},
    "ipip": {"DirectRouting": st.one_of(st.booleans(), numbers)},
    "wireguard": {"ListenPort": ports, "ListenPortV6": ports, "MTU": numbers,
                  "PSK": st.one_of(odd_strings, st.just(_KEY), numbers),
                  "PersistentKeepaliveInterval": numbers,
                  "Mode": st.sampled_from(["separate", "auto", "ipv4", "ipv6", "IPv4", ""])},
    "extension": {name: st.one_of(odd_strings, numbers) for name in (
        "PreStartupCommand", "PostStartupCommand", "SubnetAddCommand", "SubnetRemoveCommand")},
    "aws-vpc": {"RouteTableID": st.one_of(
        odd_strings, st.sampled_from(["rtb-0abc", "rtb-12345678"]),
        st.lists(st.one_of(odd_strings, st.just("rtb-0abc"), numbers), max_size=60))},
    "tencent-vpc": _key_options("AKID", "https://vpc.internal.example", "http://169.254.0.23"),
    "ali-vpc": _key_options("LTAI", "https://vpc-vpc.cn-hangzhou.aliyuncs.com",
                            "http://100.100.100.200"),
    "gce": {"Project": st.one_of(odd_strings, numbers, st.just("my-project-1"),
                                 st.just("example.com:my-project")),
            "Network": st.one_of(odd_strings, st.just("default"), st.just("-bad")),
            "Endpoint": st.sampled_from(["", "https://compute.googleapis.com", "ftp://x",
                                         "http://u@h/", "https://h:99999", "https://h:port",
                                         "http://[::1", "https://h/compute/v1"])},
}


def _backend_object(kind: str) -> st.SearchStrategy[Any]:
    members = [st.tuples(case_variants(name), st.one_of(values, json_values))
               for name, values in FIELDS[kind].items()]
    return st.builds(lambda pairs, extra: dict(pairs + extra),
                     st.lists(st.one_of(*members), max_size=len(FIELDS[kind]) + 2),
                     st.lists(st.tuples(odd_strings, json_values), max_size=2))


backend_objects = st.one_of(*(
    st.tuples(st.just(kind), _backend_object(kind)) for kind in FIELDS))
_NETWORK = IPv4Network("10.244.0.0/16")
_ADDRESS = IPv4Address("192.168.0.1")


def run_backend_config(data: tuple[str, dict[str, Any]]) -> None:
    """The backend's options through the daemon's own path: the network config decoder
    (which keeps Backend as decoded JSON), then the backend's parser."""
    kind, backend = data
    try:
        cfg = parse_config(json.dumps({"Network": str(_NETWORK),
                                       "Backend": {**backend, "Type": kind}}, allow_nan=True))
    except ConfigError:  # NaN, Infinity, a number beyond float range: refused before
        return
    options = cfg.backend
    try:
        if kind == "vxlan":
            vxlan = VxlanConfig.from_backend(options)
            assert 0 <= vxlan.vni < 1 << 24 and 0 <= vxlan.port <= 65535
        elif kind == "udp":
            assert 1 <= UdpConfig.from_backend(options).port <= 65535
        elif kind == "ipip":
            assert isinstance(IpipConfig.from_backend(options).direct_routing, bool)
        elif kind == "wireguard":
            wg = WireguardConfig.from_backend(options)
            assert 1 <= wg.listen_port <= 65535 and 1 <= wg.listen_port_v6 <= 65535
            assert wg.mode in ("separate", "auto", "ipv4", "ipv6")
        elif kind == "extension":
            ext = ExtensionConfig.from_backend(options)
            assert all(isinstance(c, str) for c in (ext.pre_startup, ext.subnet_add))
        elif kind == "aws-vpc":
            aws = AwsVpcConfig.from_backend(options, _NETWORK, _ADDRESS)
            assert all(t.startswith("rtb-") for t in aws.route_table_ids)
        elif kind == "ali-vpc":
            ali = AliVpcConfig.from_backend(options, _NETWORK, environ={})
            assert ali.access_key_id.isprintable() and ali.access_key_secret.isprintable()
            assert ali.metadata_url.startswith("http://")
        elif kind == "gce":
            gce = GceConfig.from_backend(options, _NETWORK, environ={})
            assert gce.endpoint.startswith(("http://", "https://"))
            assert not gce.project or gce.project.isprintable()
        else:
            TencentVpcConfig.from_backend(options, _NETWORK, _ADDRESS, environ={})
    except BackendConfigError as err:  # every backend's options refuse with this one type
        text = str(err)
        assert text and len(text) < 2000, "a refusal names the problem briefly"
        assert _KEY not in text, "a refusal never echoes a key"


# -- a peer's BackendData, through each backend's decoder ---------------------------------

class RawText(str):
    """JSON text put into the lease as it is (deep nesting, a huge number, a string)."""


_data_values = st.one_of(
    json_values, st.one_of(deep, huge_numbers).map(RawText),
    st.fixed_dictionaries({}, optional={
        "VtepMAC": st.one_of(odd_strings, numbers, st.sampled_from(
            ["96:59:b2:3f:04:ee", "96:59:B2:3F:04:EE", "96:59:b2:3f:04", "96-59-b2-3f-04-ee",
             "96:59:b2:3f:04:ee:00:11", "0:0:0:0:0:0"])),
        "VNI": numbers,
        "PublicKey": st.one_of(odd_strings, numbers, st.sampled_from(
            [_KEY, _KEY[:-2], _KEY + "=", "A" * 43 + "=", "@" * 44])),
        "Port": ports,
    }),
    st.sampled_from(['"a command argument"', '"\\u0000"', '""', "", " "]).map(RawText),
)


def _lease_with(raw: Any, via_etcd: bool, backend_type: str) -> Lease | None:
    """A remote lease carrying ``raw`` as BackendData (and BackendV6Data): decoded from an
    etcd lease value, or the raw text as a node annotation hands it over."""
    text = str(raw) if isinstance(raw, RawText) else render(raw, None)
    if via_etcd:
        value = ('{"PublicIP":"192.168.0.7","BackendType":' + json.dumps(backend_type)
                 + ',"BackendData":' + text + ',"BackendV6Data":' + text + '}')
        try:
            attrs = LeaseAttrs.from_json(value)
        except LeaseDecodeError:
            return None
    else:
        attrs = LeaseAttrs(IPv4Address("192.168.0.7"), IPv6Address("fd00:ff::7"),
                           backend_type, text, text)
    return Lease(IPv4Network("10.244.7.0/24"), None, attrs)


_WG = WireguardConfig.from_backend({})
_WG_NETWORK = parse_config(b'{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}')


def run_peer_data(data: tuple[Any, bool]) -> None:
    raw, via_etcd = data
    for kind in ("vxlan", "wireguard", "extension"):
        lease = _lease_with(raw, via_etcd, kind)
        if lease is None:
            return
        if kind == "vxlan":
            mac, why = peer_mac(lease, 4)
            assert (mac is None) == bool(why)
            assert mac is None or (len(mac_bytes(mac)) == 6 and mac == mac.lower()
                                   and any(mac_bytes(mac)) and not mac_bytes(mac)[0] & 1)
        elif kind == "wireguard":
            parsed = decode_lease_data(lease.attrs.backend_data)
            if parsed is not None:
                parse_key(parsed.public_key, "PublicKey")
                assert 0 <= parsed.port <= 65535
            peers = desired_peers(_WG, DeviceLayout("flannel-wg", 51820, (4,)), [lease],
                                  LocalEndpoints(_ADDRESS))
            assert len(peers) == (parsed is not None)
            assert (WireguardBackend.lease_problem(lease, _WG_NETWORK) is not None) == (
                parsed is None and decode_lease_data(lease.attrs.backend_v6_data) is None)
            assert len(WireguardBackend.identities(lease, _WG_NETWORK)) <= 2
        else:
            stdin = peer_stdin(lease)
            assert stdin is None or (isinstance(stdin, str) and stdin.endswith("\n"))


TARGETS: list[FuzzTarget] = [
    FuzzTarget("backend options (every backend's parser)", backend_objects, run_backend_config),
    FuzzTarget("peer BackendData (vxlan, wireguard, extension decoders)",
               st.tuples(_data_values, st.booleans()), run_peer_data),
]
