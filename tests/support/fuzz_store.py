"""Fuzz targets for every decoder flanneld applies to the store and its own files.

Each target feeds hostile input to the real decoder: the network config (etcd key and
net-conf.json), an etcd lease (key and value, through the etcd manager's own decode step),
a subnet key run through the peer filter, a node object's annotations (kube mode), and the
previous subnet.env. Hostile means: nesting far beyond any limit, huge strings and numbers,
NaN and Infinity, wrong JSON types, non-UTF-8 bytes, one field spelled in several cases,
and valid-looking keys such as ``0.0.0.0-1``. ``run`` returns on acceptance or on the
decoder's designed refusal and checks what an accepted input promises; anything else that
escapes is a crash.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from flannel.clients.etcd import KeyValue
from flannel.config import ConfigError, check_network_config, parse_config
from flannel.lease import Lease, LeaseAttrs, LeaseDecodeError, parse_subnet_key
from flannel.subnet.envfile import read_env, single_cidr
from flannel.subnet.etcd.manager import EtcdSubnetManager
from flannel.subnet.kube.annotations import AnnotationError, Annotations, node_lease
from flannel.subnet.watch import LeaseWatcher, Snapshot, peer_problem
from flannel.untrusted.netutil import unusable_address
from tests.support.fuzzing import FuzzTarget

# -- building blocks ----------------------------------------------------------------------

_DEEP = "__deep__"

numbers = st.one_of(
    st.integers(), st.integers(min_value=-(10 ** 40), max_value=10 ** 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1 << 64, 2 ** 31, 128, 33, 4096]),
)
odd_strings = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "null", "0.0.0.0", "::", "127.0.0.1", "224.0.0.1", "169.254.1.1",
                     "fe80::1", "ff02::1", "10.244.0.0/16", "0.0.0.0/0", "10.244.3.0",
                     "fd00:10:244::/56", "fd00:10:244:5::", "vxlan", "host-gw", "UDP",
                     "10.0.0.300", "1.2.3.4/33", "\u2028<&>", "\x00", "a" * 5000]),
)
json_leaves = st.one_of(st.none(), st.booleans(), numbers, odd_strings)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_strings, inner, max_size=4),
    max_leaves=12,
)


def case_variants(name: str) -> st.SearchStrategy[str]:
    """One field name spelled the way a hand-written document might (Go matches any case)."""
    return st.sampled_from([name, name.lower(), name.upper(), name.swapcase(),
                            name[:1].lower() + name[1:]])


def deep_json(depth: int, kind: int) -> str:
    opener, closer = (("[", "]"), ('{"a":', "}"), ('[{"a":', "}]"))[kind]
    return opener * depth + "1" + closer * depth


deep = st.builds(deep_json, st.integers(min_value=1, max_value=3000),
                 st.integers(min_value=0, max_value=2))
deep_unclosed = st.integers(min_value=1, max_value=20000).map(lambda n: "[" * n)
huge_numbers = st.sampled_from(["1e400", "-1e400", "9" * 5000, "1" + "0" * 400, "NaN",
                                "Infinity", "-Infinity", "1.5e308", "4.9e-325"])


def render(doc: Any, splice: str | None) -> str:
    """JSON text of ``doc`` (NaN/Infinity as Python writes them), with one ``__deep__``
    string replaced by raw text (deep nesting, a huge number)."""
    text = json.dumps(doc, allow_nan=True)
    if splice is not None:
        text = text.replace(json.dumps(_DEEP), splice, 1)
    return text


def documents(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """Byte strings that are mostly objects with the given fields in any case, plus raw
    hostile bytes."""
    members = [st.tuples(case_variants(name), st.one_of(values, json_values, st.just(_DEEP)))
               for name, values in fields.items()]
    structured = st.builds(
        lambda pairs, extra, splice: render(dict(pairs + extra), splice),
        st.lists(st.one_of(*members), max_size=len(fields) + 2),
        st.lists(st.tuples(odd_strings, json_values), max_size=2),
        st.one_of(st.none(), deep, deep_unclosed, huge_numbers),
    ).map(lambda text: text.encode("utf-8", "surrogatepass"))
    return st.one_of(
        structured,
        structured.map(lambda raw: raw.replace(b'"', b'"\xff', 1)),
        structured.map(lambda raw: raw[: len(raw) // 2]),
        deep.map(str.encode),
        deep_unclosed.map(str.encode),
        json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
        st.binary(max_size=200),
    )


# -- network config -----------------------------------------------------------------------

_cidrs4 = st.sampled_from(["10.244.0.0/16", "224.0.0.0/4", "127.0.0.0/8", "0.0.0.0/8",
                           "169.254.0.0/16", "0.0.0.0/0", "0.0.0.0/1", "10.0.0.0/30",
                           "10.5.1.7/16", "192.168.0.0/24", "fd00::/56", "10.0.0.0/33"])
_cidrs6 = st.sampled_from(["fd00:10:244::/56", "ff00::/8", "::1/128", "fe80::/10", "::/0",
                           "fc00::/125", "10.0.0.0/8", "fd00::/127"])
CONFIG_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "Network": _cidrs4, "IPv6Network": _cidrs6,
    "EnableIPv4": st.booleans(), "EnableIPv6": st.booleans(), "EnableNFTables": st.booleans(),
    "SubnetLen": st.integers(min_value=-2, max_value=140),
    "IPv6SubnetLen": st.integers(min_value=-2, max_value=140),
    "SubnetMin": st.sampled_from(["10.244.9.0", "10.244.3.0", "10.245.0.0", "0.0.0.0"]),
    "SubnetMax": st.sampled_from(["10.244.2.0", "10.244.200.0", "10.244.3.1"]),
    "IPv6SubnetMin": st.sampled_from(["fd00:10:244:9::", "fd00:10:244:1::1"]),
    "IPv6SubnetMax": st.sampled_from(["fd00:10:244:2::", "fd00:10:244:ff::"]),
    "Backend": st.one_of(st.none(), st.just({}),
                         st.fixed_dictionaries({"Type": st.one_of(odd_strings, numbers)}),
                         st.dictionaries(case_variants("Type"), odd_strings, max_size=3)),
    "NonMasqueradeCIDRs": st.lists(st.one_of(_cidrs4, _cidrs6, numbers), max_size=3),
}


def run_config(raw: bytes) -> None:
    try:
        cfg = parse_config(raw)
        check_network_config(cfg)
    except ConfigError as err:
        assert str(err) and len(err.describe()) < 2000, "a refusal names the problem briefly"
        return
    if cfg.enable_ipv4:
        assert cfg.network is not None and cfg.subnet_min <= cfg.subnet_max
    assert cfg.backend_type, "an accepted config names its backend"


# -- lease key + value, through the etcd manager's decode step --------------------------

LEASE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "PublicIP": st.sampled_from(["10.0.0.1", "0.0.0.0", "fd00::1", "1.2.3", "::ffff:1.2.3.4"]),
    "PublicIPv6": st.sampled_from(["fd00::1", "::", "10.0.0.1", "fe80::1"]),
    "BackendType": st.sampled_from(["vxlan", "host-gw", "wireguard", ""]),
    "BackendData": st.one_of(
        st.fixed_dictionaries({"VNI": numbers, "VtepMAC": odd_strings}), json_values),
    "BackendV6Data": json_values,
}
subnet_keys = st.one_of(
    st.sampled_from(["10.244.3.0-24", "0.0.0.0-1", "0.0.0.0-0", "192.168.111.0-25",
                     "10.244.0.0-16", "10.244.3.0-24&fd00:10:244:3::-64", "0.0.0.0-0&::-0",
                     "10.244.3.7-24", "10.244.3.0-32", "999.1.1.1-24", "10x244y3z0-24",
                     "1.2.3.4-" + "9" * 5000, "10.244.3.0-24&" + "f" * 5000 + "-64",
                     "10.244.3.0-24&fd00::-128", "a/../10.244.3.0-24"]),
    st.from_regex(r"\A\d{1,4}\.\d{1,4}\.\d{1,4}\.\d{1,4}-\d{1,3}(&[0-9a-f:]{0,24}-\d{1,3})?\Z"),
    st.text(max_size=40),
)
PREFIX = "/coreos.com/network"
_etcd = EtcdSubnetManager(None, PREFIX)  # decoding only: the client is never used


def run_lease(data: tuple[bytes, bytes]) -> None:
    key, value = data
    kv = KeyValue(f"{PREFIX}/subnets/".encode() + key, value, 7, 1, 1)
    lease = _etcd._decode(kv)
    if lease is None:
        return
    attrs = lease.attrs
    for v6 in (False, True):
        try:
            attrs.backend_json(v6=v6)
        except LeaseDecodeError:
            pass
    assert LeaseAttrs.from_json(attrs.to_json()) == attrs, "re-encoding changes nothing"


# -- subnet key through the peer filter -------------------------------------------------

WATCH_CONFIG = parse_config(b'{"Network": "10.244.0.0/16", "EnableIPv6": true, '
                            b'"IPv6Network": "fd00:10:244::/56", "Backend": {"Type": "vxlan"}}')
check_network_config(WATCH_CONFIG)
OWN = Lease(IPv4Network("10.244.1.0/24"), IPv6Network("fd00:10:244:1::/64"),
            LeaseAttrs(IPv4Address("192.168.0.1"), IPv6Address("fd00:ff::1")))
public_v4 = st.sampled_from([None, "0.0.0.0", "127.0.0.1", "224.0.0.5", "169.254.0.9",
                             "192.168.0.7", "255.255.255.255"]).map(
    lambda t: IPv4Address(t) if t else None)
public_v6 = st.sampled_from([None, "::", "::1", "ff02::1", "fe80::7", "fd00:ff::7"]).map(
    lambda t: IPv6Address(t) if t else None)


def run_subnet_key(data: tuple[str, IPv4Address | None, IPv6Address | None]) -> None:
    key, public, public6 = data
    subnets = parse_subnet_key(key)
    if subnets is None:
        return
    v4 = None if subnets[0] == IPv4Network("0.0.0.0/0") else subnets[0]
    lease = Lease(v4, subnets[1], LeaseAttrs(public, public6))
    watcher = LeaseWatcher(OWN, WATCH_CONFIG)
    watcher.apply(Snapshot([OWN, lease]))
    for peer in watcher.leases:
        assert peer_problem(peer, WATCH_CONFIG, OWN) is None
        if peer.subnet is not None:
            assert peer.subnet.subnet_of(WATCH_CONFIG.network)
            assert peer.subnet.prefixlen == WATCH_CONFIG.subnet_len
            assert not peer.subnet.overlaps(OWN.subnet)
            assert unusable_address(peer.attrs.public_ip) is None
    assert len(watcher.leases) + len(watcher.skipped.current) <= 1


# -- node annotations (kube) ------------------------------------------------------------

NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")
_annotation_values = st.one_of(
    odd_strings, json_values, deep, huge_numbers,
    json_values.map(lambda v: json.dumps(v, allow_nan=True)),
    st.sampled_from(['{"VtepMAC":"96:59:b2:3f:04:ee"}', "true", "null"]),
)
_annotation_keys = st.one_of(
    st.sampled_from([NAMES.subnet_manager, NAMES.backend_type, NAMES.backend_data,
                     NAMES.backend_v6_data, NAMES.public_ip, NAMES.public_ipv6,
                     NAMES.public_ip_overwrite, NAMES.subnet_manager.upper()]),
    st.text(max_size=20),
)
_managed = st.fixed_dictionaries({NAMES.subnet_manager: st.just("true")})
_pod_cidrs = st.one_of(
    st.lists(st.one_of(_cidrs4, _cidrs6, numbers, st.none()), max_size=3), json_values)
nodes = st.fixed_dictionaries({
    "metadata": st.one_of(json_values, st.fixed_dictionaries({
        "name": st.one_of(odd_strings, numbers, st.none()),
        "annotations": st.one_of(json_values, st.builds(
            lambda base, extra: {**extra, **base}, _managed,
            st.dictionaries(_annotation_keys, _annotation_values, max_size=8))),
    })),
    "spec": st.one_of(json_values, st.fixed_dictionaries(
        {}, optional={"podCIDR": st.one_of(_cidrs4, numbers, json_values),
                      "podCIDRs": _pod_cidrs})),
})

# Nodes that pass every check but one field, so that the deep decoders are reached.
plausible_nodes = st.builds(
    lambda name, cidrs, ip, ip6, data, data6: {
        "metadata": {"name": name, "annotations": {
            NAMES.subnet_manager: "true", NAMES.backend_type: "vxlan", NAMES.public_ip: ip,
            NAMES.public_ipv6: ip6, NAMES.backend_data: data, NAMES.backend_v6_data: data6}},
        "spec": {"podCIDRs": cidrs}},
    st.text(max_size=10),
    st.sampled_from([["10.244.7.0/24"], ["10.244.7.0/24", "fd00:10:244:7::/64"],
                     ["0.0.0.0/1", "::/1"], ["192.168.111.0/25"]]),
    st.sampled_from(["192.168.0.7", "0.0.0.0", "127.0.0.1", "10.244.7.1"]),
    st.sampled_from(["fd00:ff::7", "::", "ff02::1"]),
    _annotation_values, _annotation_values,
)


def run_node(data: tuple[dict[str, Any], bool, bool]) -> None:
    node, ipv4, ipv6 = data
    try:
        lease = node_lease(node, NAMES, ipv4, ipv6)
    except AnnotationError:
        return
    for v6 in (False, True):
        lease.attrs.backend_json(v6=v6)  # validated on the way in: must decode
    peer_problem(lease, WATCH_CONFIG, OWN)


# -- the previous subnet.env ------------------------------------------------------------

env_lines = st.one_of(
    st.sampled_from([b"FLANNEL_SUBNET=10.244.3.1/24", b"FLANNEL_IPV6_SUBNET=fd00::1/64",
                     b"FLANNEL_SUBNET=10.244.3.1/24,10.9.0.1/16", b"export FLANNEL_MTU=1450",
                     b"FLANNEL_SUBNET='10.1.0.1/24'", b"=value", b"garbage", b"#comment",
                     b"FLANNEL_SUBNET=\xff\xfe", b"\x00\x00", b"FLANNEL_SUBNET=" + b"9" * 5000]),
    st.binary(max_size=60),
)
env_files = st.one_of(
    st.tuples(st.just("file"), st.lists(env_lines, max_size=8).map(b"\n".join)),
    st.tuples(st.just("file"), st.integers(min_value=1, max_value=200_000).map(
        lambda n: b"FLANNEL_SUBNET=10.1.1.1/24\n" + b"x" * n)),
    st.tuples(st.sampled_from(["directory", "fifo", "missing", "dangling symlink"]),
              st.just(b"")),
)
_scratch: list[Path] = []


def _scratch_dir() -> Path:
    if not _scratch:
        _scratch.append(Path(tempfile.mkdtemp(prefix="fuzz-subnet-env-")))
        atexit.register(shutil.rmtree, _scratch[0], ignore_errors=True)
    return _scratch[0]


def run_env(data: tuple[str, bytes]) -> None:
    kind, content = data
    path = _scratch_dir() / "subnet.env"
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "file":
        path.write_bytes(content)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling symlink":
        path.symlink_to(path.parent / "nowhere")
    values = read_env(path)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in values.items())
    single_cidr(values, "FLANNEL_SUBNET", 4)
    single_cidr(values, "FLANNEL_IPV6_SUBNET", 6)


TARGETS: list[FuzzTarget] = [
    FuzzTarget("network config", documents(CONFIG_FIELDS), run_config),
    FuzzTarget("lease (etcd key and value)",
               st.tuples(subnet_keys.map(lambda k: k.encode("utf-8", "surrogatepass"))
                         | st.binary(max_size=30), documents(LEASE_FIELDS)), run_lease),
    FuzzTarget("subnet key through the peer filter",
               st.tuples(subnet_keys, public_v4, public_v6), run_subnet_key),
    FuzzTarget("node annotations",
               st.tuples(nodes | plausible_nodes, st.booleans(), st.booleans()), run_node),
    FuzzTarget("previous subnet.env", env_files, run_env),
]
