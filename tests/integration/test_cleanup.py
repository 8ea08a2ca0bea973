"""``flannelctl cleanup`` on a node (a network namespace) where a real flanneld (vxlan, dual
stack, masquerade, blackholes) ran, with foreign devices, routes, chains and files beside:
ours go, the foreign ones stay; --dry-run lists and changes nothing; refusal while flanneld
runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from ipaddress import ip_network
from pathlib import Path

import pytest

from flannel.kernel.host import Host
from flannel.rules.nftables import NftablesRules
from flannel.rules.spec import FamilyRules
from flannel_lab.etcd import EtcdServer
from tests.support import netns
from tests.support.flanneld import Flanneld
from tests.support.waiting import wait_until

pytestmark = pytest.mark.netns

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
PREFIX = "/coreos.com/network"
COUNTERS = re.compile(r" \[\d+:\d+\]$")  # packet counters move with the etcd traffic
CONFIG = {"Network": "10.5.0.0/16", "EnableIPv6": True, "IPv6Network": "fd05::/48",
          "Backend": {"Type": "vxlan"}}
PEER_KEY = "10.5.7.0-24&fd05:0:0:7::-64"
PEER = {"PublicIP": "10.99.0.7", "PublicIPv6": "fd99::7", "BackendType": "vxlan",
        "BackendData": {"VNI": 1, "VtepMAC": "0e:00:00:00:00:07"},
        "BackendV6Data": {"VNI": 1, "VtepMAC": "0e:00:00:00:06:07"}}


def run(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                            timeout=60, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd}: {result.stdout}{result.stderr}")
    return result


def state(ns: str, dirs: list[Path]) -> dict[str, str]:
    """Everything cleanup could touch, as text."""
    return {
        "links": run(ns, "ip", "-d", "-o", "link", "show").stdout,
        # The kernel adds link-local routes and multicast FDB entries on its own schedule.
        "routes4": run(ns, "ip", "-4", "route", "show", "table", "main").stdout,
        "routes6": "".join(line for line in run(ns, "ip", "-6", "route", "show", "table",
                                                "main").stdout.splitlines(keepends=True)
                           if not line.startswith("fe80::")),
        "neigh": run(ns, "ip", "neigh", "show", "nud", "permanent").stdout,
        "fdb": "".join(line for line in run(ns, "bridge", "fdb", "show").stdout.splitlines(
            keepends=True) if " dst " in line),
        **{tool: "\n".join(COUNTERS.sub("", line) for line in run(ns, tool).stdout.splitlines()
                           if not line.startswith("#"))
           for tool in ("iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save",
                        "ip6tables-nft-save")},
        "nft": run(ns, "nft", "list", "ruleset").stdout,
        "files": "\n".join(sorted(str(p) for d in dirs for p in d.rglob("*"))),
    }


@pytest.fixture
def node(ns, tmp_path):
    """A host with a v4 and v6 underlay and default routes, and its own etcd holding the
    config and one peer lease."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("addr", "add", "fd99::2/64", "dev", "veth0", "nodad", netns=ns)
    for dev in ("veth0", "veth1"):
        netns.ip("link", "set", dev, "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    netns.ip("-6", "route", "add", "default", "via", "fd99::1", "dev", "veth0", netns=ns)
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
        server.ctl("put", f"{PREFIX}/subnets/{PEER_KEY}", json.dumps(PEER))
        yield ns, server


def start_flanneld(tmp_path: Path, ns: str, server: EtcdServer, env_file: Path) -> Flanneld:
    return Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}", "--ip-masq",
                               "--ip-blackhole-route", "--iptables-resync=1",
                               f"--subnet-file={env_file}"], netns=ns).start()


def add_foreign_state(ns: str, foreign_bin: Path, bin_dir: Path, conf_dir: Path) -> None:
    for args in (
        ("link", "add", "flannel.9", "type", "bridge"),  # our name pattern, not our type
        ("link", "add", "vx-foreign", "type", "vxlan", "id", "42", "dstport", "4789",
         "dev", "veth0"),
        ("link", "set", "vx-foreign", "addrgenmode", "none"),  # no link-local appearing later
        ("link", "set", "vx-foreign", "up"),
        ("neigh", "add", "10.77.0.1", "lladdr", "0e:00:00:00:00:42", "dev", "vx-foreign",
         "nud", "permanent"),
        ("route", "add", "10.77.0.0/24", "dev", "vx-foreign"),
        ("route", "add", "10.88.0.0/24", "via", "10.99.0.1", "proto", "static"),
        ("route", "add", "blackhole", "10.66.0.0/24"),
    ):
        netns.ip(*args, netns=ns)
    run(ns, "bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vx-foreign",
        "dst", "10.99.0.42")
    run(ns, "iptables-legacy", "-N", "KUBE-FORWARD")
    run(ns, "iptables-legacy", "-A", "FORWARD", "-j", "KUBE-FORWARD")
    run(ns, "iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-s", "10.123.0.0/16",
        "-j", "MASQUERADE")
    run(ns, "nft", "add", "table", "inet", "foreign")
    # nftables-mode leftovers of ours beside them (a node that switched modes).
    NftablesRules([FamilyRules(4, ip_network("10.5.0.0/16"), ip_network("10.5.1.0/24"),
                               True, True)], Host(ns)).apply()
    foreign_bin.mkdir()
    (foreign_bin / "flannel").write_bytes(b"\x7fELF\x02\x01\x01upstream static plugin")
    (bin_dir / "bridge").write_bytes(b"\x7fELF bridge")
    (conf_dir / "99-other.conflist").write_text('{"plugins": [{"type": "bridge"}]}')


def test_cleanup_removes_ours_and_keeps_foreign_state(node, tmp_path):
    ns, server = node
    env_file, bin_dir, conf_dir = tmp_path / "run" / "subnet.env", tmp_path / "bin", \
        tmp_path / "net.d"
    foreign_bin = tmp_path / "other-bin"
    run(ns, FLANNELCTL, "install-cni", f"--bin-dir={bin_dir}", f"--conf-dir={conf_dir}")
    run(ns, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")  # legacy host
    daemon = start_flanneld(tmp_path, ns, server, env_file)
    try:
        wait_until(lambda: "blackhole 10.5." in run(ns, "ip", "route").stdout, 20,
                   what=f"blackhole route:\n{daemon.log}")
        wait_until(lambda: "fd05:0:0:7::/64 via" in run(ns, "ip", "-6", "route").stdout, 20,
                   what=f"IPv6 peer route:\n{daemon.log}")
    finally:
        daemon.stop()
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    subnet = ip_network(env["FLANNEL_SUBNET"], strict=False)
    subnet6 = ip_network(env["FLANNEL_IPV6_SUBNET"], strict=False)
    add_foreign_state(ns, foreign_bin, bin_dir, conf_dir)
    dirs = [bin_dir, conf_dir, foreign_bin, env_file.parent]
    before = state(ns, dirs)
    assert ":FLANNEL-POSTRTG" in before["iptables-legacy-save"]
    assert "flannel-v6.1" in before["links"] and "0e:00:00:00:00:07" in before["fdb"]
    # The node's /run: never the host's (wireguard-go sockets, the key, its logs).
    options = ["--run-dir", str(tmp_path / "noderun"), "--subnet-file", str(env_file),
               "--cni-bin-dir", str(bin_dir),
               "--cni-bin-dir", str(foreign_bin), "--cni-conf-dir", str(conf_dir)]

    dry = run(ns, FLANNELCTL, "cleanup", "--dry-run", *options)
    now = state(ns, dirs)
    for key in before:
        assert now[key] == before[key], f"{key} changed:\n{before[key]}\n---\n{now[key]}"
    listed = [line.removeprefix("would remove: ") for line in dry.stdout.splitlines()
              if line.startswith("would remove: ")]
    for expected in (
        "device flannel.1 (vxlan)", "device flannel-v6.1 (vxlan)",
        "route 10.5.7.0/24 via 10.5.7.0 dev flannel.1 onlink proto 151",
        "route fd05:0:0:7::/64 via fd05:0:0:7:: dev flannel-v6.1 onlink proto 151",
        f"blackhole route {subnet} metric 4242 proto 151",
        f"blackhole route {subnet6} metric 4242 proto 151",
        "neighbour fd05:0:0:7:: lladdr 0e:00:00:00:06:07 dev flannel-v6.1",
        "neighbour 10.5.7.0 lladdr 0e:00:00:00:00:07 dev flannel.1",
        "fdb entry 0e:00:00:00:00:07 dst 10.99.0.7 dev flannel.1",
        "fdb entry 0e:00:00:00:06:07 dst fd99::7 dev flannel-v6.1",
        "iptables-legacy nat chain FLANNEL-POSTRTG (and 1 jump rule(s) to it)",
        "ip6tables-legacy filter chain FLANNEL-FWD (and 1 jump rule(s) to it)",
        "nft table ip flannel-ipv4",
        f"file {env_file}", f"file {bin_dir / 'flannel'}", f"directory {bin_dir / '.flannel-cni'}",
        f"file {conf_dir / '10-flannel.conflist'}",
    ):
        assert expected in listed, f"{expected!r} not in:\n{dry.stdout}"
    assert not [line for line in listed if "foreign" in line or "flannel.9" in line]
    assert f"{len(listed)} object(s) would be removed (dry run: nothing changed)" in dry.stdout
    assert ("kept (not flannel's): device flannel.9: a bridge device, not the vxlan device "
            "flannel creates") in dry.stdout
    assert f"kept (not flannel's): file {foreign_bin / 'flannel'}: not the launcher" \
        in dry.stdout

    done = run(ns, FLANNELCTL, "cleanup", *options)
    removed = [line.removeprefix("removed: ") for line in done.stdout.splitlines()
               if line.startswith("removed: ")]
    assert removed == listed
    after = state(ns, dirs)
    assert "flannel.1" not in after["links"] and "flannel-v6.1" not in after["links"]
    assert "proto 151" not in after["routes4"] + after["routes6"]
    assert "0e:00:00:00:00:07" not in after["fdb"] + after["neigh"]
    assert "FLANNEL" not in "".join(after[k] for k in after if k.endswith("-save"))
    assert "flannel-ipv4" not in after["nft"]
    assert not env_file.exists() and not (bin_dir / "flannel").exists()
    assert not (bin_dir / ".flannel-cni").exists()
    assert not (conf_dir / "10-flannel.conflist").exists()
    # Foreign state is exactly as it was.
    for needle, where in (
        ("flannel.9", "links"), ("vx-foreign", "links"), ("veth0", "links"),
        ("10.77.0.0/24 dev vx-foreign", "routes4"), ("10.88.0.0/24 via 10.99.0.1", "routes4"),
        ("blackhole 10.66.0.0/24", "routes4"), ("default via fd99::1", "routes6"),
        ("10.77.0.1 dev vx-foreign lladdr 0e:00:00:00:00:42", "neigh"),
        ("dst 10.99.0.42", "fdb"), (":KUBE-FORWARD", "iptables-legacy-save"),
        ("-A FORWARD -j KUBE-FORWARD", "iptables-legacy-save"),
        (":KUBE-IPTABLES-HINT", "iptables-legacy-save"),
        ("-A POSTROUTING -s 10.123.0.0/16 -j MASQUERADE", "iptables-nft-save"),
        ("table inet foreign", "nft"),
    ):
        assert needle in after[where], f"{needle!r} gone from {where}:\n{after[where]}"
    assert (foreign_bin / "flannel").read_bytes().startswith(b"\x7fELF")
    assert (bin_dir / "bridge").exists() and (conf_dir / "99-other.conflist").exists()

    again = run(ns, FLANNELCTL, "cleanup", *options)
    assert "nothing of flannel's found" in again.stdout


def test_cleanup_refuses_while_flanneld_runs_here(node, tmp_path):
    ns, server = node
    env_file = tmp_path / "subnet.env"
    daemon = start_flanneld(tmp_path, ns, server, env_file)
    try:
        wait_until(env_file.exists, 20, what=f"subnet.env:\n{daemon.log}")
        refused = run(ns, FLANNELCTL, "cleanup", "--run-dir", str(tmp_path / "noderun"),
                      "--subnet-file", str(env_file), check=False)
        assert refused.returncode == 1
        assert (f"flannelctl cleanup: flanneld is running in this network namespace (pid "
                f"{daemon.proc.pid}); it would recreate what cleanup removes") in refused.stderr
        assert env_file.exists()
        assert "flannel.1" in run(ns, "ip", "link").stdout
        forced = run(ns, FLANNELCTL, "cleanup", "--force", "--dry-run", "--run-dir",
                     str(tmp_path / "noderun"), "--subnet-file", str(env_file))
        assert "would remove: device flannel.1 (vxlan)" in forced.stdout
    finally:
        daemon.stop()


def test_a_flanneld_in_another_namespace_does_not_block(node, tmp_path):
    ns, server = node
    env_file = tmp_path / "subnet.env"
    daemon = start_flanneld(tmp_path, ns, server, env_file)
    other = netns.create()
    try:
        wait_until(env_file.exists, 20, what=f"subnet.env:\n{daemon.log}")
        result = run(other, FLANNELCTL, "cleanup", "--dry-run", "--run-dir",
                     str(tmp_path / "none"), "--subnet-file",
                     str(tmp_path / "none.env"), "--cni-bin-dir", str(tmp_path / "none"),
                     "--cni-conf-dir", str(tmp_path / "none"))
        assert result.stdout.strip() == "nothing of flannel's found"
    finally:
        daemon.stop()
        netns.delete(other)
