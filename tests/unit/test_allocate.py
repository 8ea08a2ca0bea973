"""Free-subnet choice (flannel/subnet/etcd/candidates.py) and lease compatibility (compat 3.5)."""

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from flannel.config import check_network_config, parse_config
from flannel.subnet.etcd.candidates import address_range, free_subnet, node_seed
from flannel.subnet.etcd.manager import subnet_fits


def cfg(text: str):
    config = parse_config(text)
    check_network_config(config)
    return config


def pick(taken=(), seed=b"\x0a\x00\x00\x01", attempt=0, first="10.3.1.0", last="10.3.8.0"):
    return free_subnet(IPv4Network, 24, 32, IPv4Address(first), IPv4Address(last),
                       [address_range(IPv4Network(n)) for n in taken], seed, attempt)


def seed_landing_at(index: int, count: int = 8) -> bytes:
    """A node seed whose hashed point is the ``index``-th subnet of ``count``."""
    for n in range(10_000):
        seed = IPv4Address(0xC0A80000 + n).packed
        if pick(seed=seed, last=str(IPv4Address(0x0A030100 + (count - 1) * 256))) \
                == IPv4Network((0x0A030100 + index * 256, 24)):
            return seed
    raise AssertionError("no seed found")


def test_consecutive_public_ips_spread_over_the_range():
    seeds = [node_seed(IPv4Address(int(IPv4Address("192.168.1.1")) + i), None)
             for i in range(200)]
    picks = [pick(seed=s, first="10.0.0.0", last="10.255.255.0") for s in seeds]
    assert len(set(picks)) >= 195  # 200 hashed into 65536 subnets: at most a few collide
    octets = {int(p.network_address.packed[1]) for p in picks}
    assert len(octets) > 100  # not packed at the bottom of the range


def test_same_node_same_attempt_is_stable_and_another_attempt_moves():
    seed = node_seed(IPv4Address("192.168.1.7"), None)
    args = dict(seed=seed, first="10.0.0.0", last="10.255.255.0")
    assert pick(**args) == pick(**args)
    assert len({pick(**args, attempt=a) for a in range(10)}) == 10


def test_takes_the_first_free_subnet_at_or_after_the_point_skipping_taken_ranges():
    seed = seed_landing_at(2)  # 10.3.3.0/24
    assert pick(seed=seed) == IPv4Network("10.3.3.0/24")
    taken = ["10.3.3.0/24", "10.3.4.0/23", "10.3.6.128/25"]
    assert pick(taken, seed=seed) == IPv4Network("10.3.7.0/24")


def test_wraps_from_subnet_max_to_subnet_min():
    seed = seed_landing_at(6)  # 10.3.7.0/24, the one before SubnetMax 10.3.8.0
    taken = ["10.3.7.0/24", "10.3.8.0/24", "10.3.1.0/24"]
    assert pick(taken, seed=seed) == IPv4Network("10.3.2.0/24")


def test_a_wide_key_covering_the_start_is_jumped_over():
    assert pick(["10.3.0.0/21"], seed=seed_landing_at(3)) == IPv4Network("10.3.8.0/24")


def test_none_when_every_subnet_is_taken():
    assert pick(["10.3.0.0/20"]) is None
    assert pick([f"10.3.{i}.0/24" for i in range(1, 9)]) is None


def test_ipv6_by_arithmetic_over_a_huge_range():
    seed = node_seed(None, IPv6Address("2001:db8::5"))
    first = IPv6Address("fc00::")
    last = IPv6Address("fc00:ffff:ffff:ffff::")  # 2**48 /64 subnets, never listed
    chosen = free_subnet(IPv6Network, 64, 128, first, last, [], seed)
    assert chosen.prefixlen == 64 and first <= chosen.network_address <= last
    taken = [chosen, IPv6Network((int(chosen.network_address) + (1 << 64), 64))]
    after = free_subnet(IPv6Network, 64, 128, first, last, map(address_range, taken), seed)
    assert int(after.network_address) == int(chosen.network_address) + (2 << 64)


def test_ipv6_only_node_is_seeded_by_its_ipv6_address():
    assert node_seed(None, IPv6Address("2001:db8::5")) == IPv6Address("2001:db8::5").packed
    assert node_seed(IPv4Address("1.2.3.4"), IPv6Address("2001:db8::5")) == bytes([1, 2, 3, 4])


def test_subnet_fits():
    config = cfg('{"Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.25.0"}')
    assert subnet_fits(config, IPv4Network("10.3.6.0/24"), None)
    assert not subnet_fits(config, IPv4Network("10.4.1.0/24"), None)
    assert not subnet_fits(config, IPv4Network("10.3.31.0/24"), None)
    assert not subnet_fits(config, IPv4Network("10.3.6.0/25"), None)
    assert not subnet_fits(config, IPv4Network("10.3.6.0/24"), IPv6Network("fd00::/64"))
    dual = cfg('{"Network": "10.3.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00::/56"}')
    assert subnet_fits(dual, IPv4Network("10.3.6.0/24"), IPv6Network("fd00:0:0:5::/64"))
    assert not subnet_fits(dual, IPv4Network("10.3.6.0/24"), None)
