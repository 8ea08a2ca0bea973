"""``flannelctl leases`` against a real etcd (and the kube API test double for ``list``):
what an operator sees and what the writes leave in the store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flannel.ops.parsers import RELEASE_EFFECT
from tests.support.kubeapi import FakeKubeAPI

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
CONFIG = '{"Network": "10.244.0.0/16", "SubnetLen": 24, "Backend": {"Type": "vxlan"}}'
VXLAN_VALUE = ('{"PublicIP":"192.168.1.11","PublicIPv6":null,"BackendType":"vxlan",'
               '"BackendData":{"VNI":1,"VtepMAC":"0E:00:00:00:00:01"}}')


def ctl(etcd, prefix: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [FLANNELCTL, "leases", *args, f"--etcd-endpoints={etcd.endpoint}",
         f"--etcd-prefix={prefix}"], input=stdin, capture_output=True, text=True,
        timeout=60, check=False)


@pytest.fixture
def store(etcd, prefix):
    etcd.ctl("put", f"{prefix}/config", CONFIG)
    lease_id = etcd.ctl("lease", "grant", "3600").stdout.split()[1]
    etcd.ctl("put", "--lease", lease_id, f"{prefix}/subnets/10.244.1.0-24", VXLAN_VALUE)
    etcd.ctl("put", f"{prefix}/subnets/10.244.2.0-24", '{"PublicIP":"192.168.1.12"}')
    etcd.ctl("put", f"{prefix}/subnets/garbage", "not json")
    return etcd


def test_list_shows_every_lease_with_expiry_and_reservations(store, prefix):
    proc = ctl(store, prefix, "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["SUBNET", "IPV6", "SUBNET", "PUBLIC", "IP", "BACKEND", "VTEP",
                                "MAC", "EXPIRES", "PROBLEM"]
    assert lines[1].split()[:5] == ["10.244.1.0/24", "-", "192.168.1.11", "vxlan",
                                    "0e:00:00:00:00:01"]
    assert lines[1].split()[5] == "in"
    assert lines[1].split()[6].startswith(("59m", "1h00m"))
    assert lines[2].split() == ["10.244.2.0/24", "-", "192.168.1.12", "-", "-", "never",
                                "(reservation)"]
    assert lines[3].split()[0] == "garbage"
    assert "'garbage' is not a subnet key" in lines[3]


def test_list_json(store, prefix):
    proc = ctl(store, prefix, "list", "--json")
    rows = {row["key"]: row for row in json.loads(proc.stdout)}
    assert rows["10.244.2.0-24"]["reservation"] is True
    assert rows["10.244.1.0-24"]["reservation"] is False
    assert 3500 < rows["10.244.1.0-24"]["ttl_seconds"] <= 3600
    assert rows["garbage"]["problem"] == "'garbage' is not a subnet key"


def test_show_by_public_ip(store, prefix):
    proc = ctl(store, prefix, "show", "192.168.1.11")
    assert proc.returncode == 0, proc.stderr
    assert "subnet:          10.244.1.0/24" in proc.stdout
    assert 'backend data:    {"VNI":1,"VtepMAC":"0E:00:00:00:00:01"}' in proc.stdout
    missing = ctl(store, prefix, "show", "10.244.9.0/24")
    assert (missing.returncode, missing.stderr) == (
        1, "flannelctl leases: no lease for 10.244.9.0/24; 'flannelctl leases list' shows them "
           "all\n")


def test_reserve_writes_a_key_without_ttl(store, prefix):
    proc = ctl(store, prefix, "reserve", "10.244.7.0/24", "--public-ip", "192.168.1.17")
    assert proc.returncode == 0, proc.stderr
    store_line, reserved = proc.stdout.splitlines()
    assert store_line == (f"store: etcd {store.endpoint}, prefix {prefix}, from the flags "
                          "given; subnet.env /run/flannel/subnet.env")
    assert reserved.startswith("reserved 10.244.7.0/24 for 192.168.1.17")
    got = store.ctl("get", f"{prefix}/subnets/10.244.7.0-24", "-w", "json").stdout
    kv = json.loads(got)["kvs"][0]
    assert "lease" not in kv  # no etcd lease: it never expires
    assert store.ctl("get", "--print-value-only",
                     f"{prefix}/subnets/10.244.7.0-24").stdout.strip() == \
        '{"PublicIP":"192.168.1.17","PublicIPv6":null}'


@pytest.mark.parametrize(("subnet", "public_ip", "message"), [
    ("10.9.0.0/24", "192.168.1.17", "10.9.0.0/24 is outside the Network 10.244.0.0/16; "
                                    "reserve a subnet inside it"),
    ("10.244.1.0/24", "192.168.1.17", "10.244.1.0/24 overlaps 10.244.1.0/24, leased to "
                                      "192.168.1.11; release that lease first or pick a free "
                                      "subnet"),
    ("10.244.8.0/24", "192.168.1.11", "192.168.1.11 already holds 10.244.1.0/24; flanneld "
                                      "would keep using it. Release it first ('flannelctl "
                                      "leases release 10.244.1.0/24'), then reserve"),
    ("10.244.8.0/25", "192.168.1.17", "10.244.8.0/25: the network hands out /24 subnets; "
                                      "reserve a /24"),
])
def test_reserve_refuses(store, prefix, subnet, public_ip, message):
    proc = ctl(store, prefix, "reserve", subnet, "--public-ip", public_ip)
    assert (proc.returncode, proc.stderr) == (1, f"flannelctl leases: {message}\n")


@pytest.mark.parametrize(("public_ip", "why"), [
    ("0.0.0.0", "it is unspecified (0.0.0.0 or ::)"),
    ("127.0.0.1", "it is a loopback address"),
    ("224.0.0.1", "it is a multicast address"),
])
def test_reserve_refuses_a_public_ip_no_node_can_hold(store, prefix, public_ip, why):
    proc = ctl(store, prefix, "reserve", "10.244.7.0/24", "--public-ip", public_ip)
    assert proc.returncode == 2
    assert proc.stderr.endswith(
        f"flannelctl leases reserve: error: argument --public-ip: {public_ip}: {why}, so no "
        "node can hold it; give the public IP of the node the subnet is for\n")
    assert store.ctl("get", f"{prefix}/subnets/10.244.7.0-24").stdout == ""


def test_reserve_rejects_a_non_base_subnet(store, prefix):
    proc = ctl(store, prefix, "reserve", "10.244.8.1/24", "--public-ip", "192.168.1.17")
    assert proc.returncode == 2
    assert "is not an IPv4 subnet with its base address" in proc.stderr


def test_release_asks_and_deletes(store, prefix):
    refused = ctl(store, prefix, "release", "10.244.1.0/24")
    assert (refused.returncode, refused.stderr) == (
        1, "flannelctl leases: not asking on a non-interactive input: pass --yes to confirm\n")
    proc = ctl(store, prefix, "release", "10.244.1.0/24", "--yes")
    assert proc.returncode == 0, proc.stderr
    # What a flanneld holding it does is said before it is deleted (tests/lab/
    # test_lease_release.py shows flanneld doing it).
    assert proc.stdout.splitlines()[1:] == [
        f"10.244.1.0-24 (lease of 192.168.1.11): {RELEASE_EFFECT}",
        "released 10.244.1.0-24 (lease of 192.168.1.11)"]
    assert store.ctl("get", f"{prefix}/subnets/10.244.1.0-24").stdout == ""
    # the others are untouched
    assert store.ctl("get", f"{prefix}/subnets/10.244.2.0-24").stdout != ""


def test_unreachable_store_is_named(prefix):
    proc = subprocess.run([FLANNELCTL, "leases", "list", "--etcd-endpoints=http://127.0.0.1:9",
                           f"--etcd-prefix={prefix}"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("flannelctl leases: ")
    assert "Traceback" not in proc.stderr


def test_flags_fall_back_to_flanneld_environment(store, prefix):
    import os

    env = {**os.environ, "FLANNELD_ETCD_ENDPOINTS": store.endpoint,
           "FLANNELD_ETCD_PREFIX": prefix}
    proc = subprocess.run([FLANNELCTL, "leases", "list", "--json"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert {row["key"] for row in json.loads(proc.stdout)} == {
        "10.244.1.0-24", "10.244.2.0-24", "garbage"}


async def test_list_in_kube_mode(tmp_path):
    api = FakeKubeAPI()
    await api.start()
    try:
        prefix = "flannel.alpha.coreos.com/"
        api.put_node("node-a", ["10.244.3.0/24"], {
            prefix + "kube-subnet-manager": "true", prefix + "backend-type": "vxlan",
            prefix + "backend-data": '{"VNI":1,"VtepMAC":"0e:00:00:00:00:03"}',
            prefix + "public-ip": "192.168.1.13"})
        api.put_node("node-b", ["10.244.4.0/24"], {})
        conf = tmp_path / "net-conf.json"
        conf.write_text(CONFIG)
        proc = await asyncio.create_subprocess_exec(
            FLANNELCTL, "leases", "list", "--kube-subnet-mgr", f"--kube-api-url={api.url}",
            f"--net-config-path={conf}", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await api.stop()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].split()[0] == "NODE"
    assert lines[1].split() == ["node-a", "10.244.3.0/24", "-", "192.168.1.13", "vxlan",
                                "0e:00:00:00:00:03", "unknown"]
    assert lines[2].split()[:2] == ["node-b", "-"]
    assert "no valid flannel annotations" in lines[2]


def test_reserve_refused_in_kube_mode(tmp_path):
    proc = subprocess.run([FLANNELCTL, "leases", "reserve", "10.244.3.0/24", "--public-ip",
                           "192.168.1.3", "--kube-subnet-mgr",
                           "--kube-api-url=http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "in kube mode a lease is a Node's podCIDR and annotations" in proc.stderr


def test_a_key_no_flanneld_can_use_is_shown_and_released_by_its_key(store, prefix):
    """What `flannelctl doctor` advises for such a key must work."""
    deep = '{"PublicIP":"192.168.1.13","BackendData":' + "[" * 40 + "]" * 40 + "}"
    store.ctl("put", f"{prefix}/subnets/10.244.3.0-24", deep)
    shown = ctl(store, prefix, "show", "10.244.3.0-24")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:2] == [
        "key:             10.244.3.0-24",
        "problem:         lease value nests JSON deeper than the limit of 32 levels"]
    released = ctl(store, prefix, "release", "10.244.3.0-24", "--yes")
    assert (released.returncode, released.stdout.splitlines()[1:]) == (
        0, ["released 10.244.3.0-24 (lease that no flanneld can use: lease value nests JSON "
            "deeper than the limit of 32 levels)"])
    assert store.ctl("get", f"{prefix}/subnets/10.244.3.0-24").stdout == ""
    assert ctl(store, prefix, "release", "garbage", "--yes").returncode == 0
    assert store.ctl("get", f"{prefix}/subnets/garbage").stdout == ""
