"""The operator tools tell the truth on a lab of every backend this machine runs, used as a
new user would: ``flannel-lab up``, then ``flannelctl check --lab``, the doctor command it
prints (pasted, with the virtualenv off PATH), ``cleanup --dry-run`` and ``leases list``
inside a node. One two-node lab per backend, every assertion on it."""

from __future__ import annotations

import ipaddress
import json
import shlex
import shutil
import subprocess
from collections.abc import Callable

import pytest

from flannel.ipsec import charon
from flannel.ops.commands import script
from flannel_lab.cluster import Lab, in_ns
from tests.support.checkout import FLANNEL_LAB, FLANNELCTL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

# A root shell's PATH: the virtualenv's bin directory is not on it.
USER_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8"}


def run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env=USER_ENV)


def up(make_lab: Callable[[], Lab], backend: str) -> Lab:
    lab = make_lab()
    proc = run([*FLANNEL_LAB, "--root", str(lab.directory.parent), "up", "--name", lab.name,
                "--backend", backend, "--nodes", "2"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Lab(lab.name, root=lab.directory.parent)


def check_lab(lab: Lab, *extra: str) -> subprocess.CompletedProcess:
    proc = run([*FLANNELCTL, "check", "--lab", lab.name, "--lab-root",
                str(lab.directory.parent), "--count=3", "--timeout=1",
                "--max-age=0", *extra])  # its own probes: faults are made just before
    assert proc.stderr == "", proc.stderr
    return proc


def matrix(lab: Lab) -> dict:
    proc = check_lab(lab, "--json")
    doc = json.loads(proc.stdout)
    assert doc["ok"] == (proc.returncode == 0)
    return doc


def doctor_command(lab: Lab, index: int, flannelctl: list[str] = FLANNELCTL) -> list[str]:
    """The doctor command ``check --lab`` prints for a node (naming the console script for
    a user to paste: ``flannelctl=[script("flannelctl")]``), run as this checkout's code."""
    node = lab.node(index)
    return ["ip", "netns", "exec", node.netns, *flannelctl, "doctor",
            f"--etcd-endpoints={lab.state.etcd_endpoint}", f"--subnet-file={node.subnet_file}"]


def subnet(lab: Lab, index: int) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(lab.wait_subnet_env(index)["FLANNEL_SUBNET"], strict=False)


UNJUDGED = {
    "extension": "the extension's own commands (SubnetAddCommand) program each peer, so this "
                 "node's kernel is not judged: the echoes alone decide",
    "aws-vpc": "the VPC's route table, not this node's kernel, carries each peer's subnet, so "
               "this node's kernel is not judged: the echoes alone decide",
    "ali-vpc": "the VPC's route table, not this node's kernel, carries each peer's subnet, so "
               "this node's kernel is not judged: the echoes alone decide",
    "alloc": "the alloc backend only reserves subnets: no traffic is carried between nodes: "
             "nothing is probed",
    "ipsec": "charon's IPsec SAs, not routes or devices of flanneld, carry the peers "
             "(`swanctl --list-sas` shows them): the echoes alone decide",
}


def needs(backend: str) -> list[pytest.MarkDecorator]:
    if backend == "wireguard":
        return [pytest.mark.skipif(shutil.which("wireguard-go") is None,
                                   reason="needs wireguard-go")]
    if backend == "ipsec":
        return [pytest.mark.skipif(not any(shutil.which(p) for p in charon.SEARCH)
                                   or not _importable("vici"),
                                   reason="needs strongSwan's charon and the vici package")]
    if backend == "aws-vpc":
        return [pytest.mark.skipif(not _importable("moto"), reason="needs moto[server]")]
    return []


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


BACKENDS = ["vxlan", "host-gw", "udp", "wireguard", "extension", "aws-vpc", "ali-vpc", "alloc",
            "ipsec"]


@pytest.mark.parametrize("backend", [pytest.param(b, marks=needs(b)) for b in BACKENDS])
def test_a_healthy_lab_is_reported_healthy(make_lab, backend):
    lab = up(make_lab, backend)
    # Every pair answers: a node's programming is judged as its backend makes it (a route
    # per peer, one route over the Network, or, said plainly, not from the kernel at all).
    # Polled: the lab's first packets may still be resolving neighbours.
    doc = wait_until(lambda: (d := matrix(lab))["ok"] and d, 45,
                     interval=0.5, what=f"every pair of the {backend} lab answering")
    verdict = "no-data-path" if backend == "alloc" else "ok"
    assert {(p["from"], p["to"]): p["verdict"] for p in doc["pairs"]} == {
        ("n1", "n2"): verdict, ("n2", "n1"): verdict}
    assert [node.get("note") for node in doc["nodes"]] == [UNJUDGED.get(backend)] * 2
    text = check_lab(lab)
    assert text.returncode == 0
    assert text.stdout.splitlines()[0] == f"lab {lab.name}: 2 nodes, 2 pairs checked, 0 failing"
    if backend in UNJUDGED:
        assert text.stdout.splitlines()[1] == f"note: {UNJUDGED[backend]}"

    # doctor as check --lab prints it: no CNI on an etcd-mode node is a note, and flanneld's
    # own --ip-masq (which the lab runs) is no sign of the VXLAN checksum bug.
    proc = run([*doctor_command(lab, 1), "--max-age=0"])
    lines = proc.stdout.splitlines()
    assert (proc.returncode, proc.stderr) == (0, "")
    unchecked = backend in ("extension", "aws-vpc", "ali-vpc", "alloc")
    assert lines[0] == ("healthy: every check that could run passed; 1 not checked (below, "
                        "and why)" if unchecked else "healthy: every check passed")
    assert lines[1].startswith("1. [info] cni: no CNI network config in /etc/cni/net.d uses "
                               "the flannel plugin: containers on this node do not get their "
                               "network through CNI")
    assert lines[2] == (f"   fix: for CNI: install the containernetworking plugins and run "
                        f"{script('flannelctl')} install-cni")
    rest = lines[3:]
    if unchecked:  # what its kernel cannot show is said, not passed over
        assert rest[0].startswith("2. [info] routes: not checked: what carries each peer, "
                                  "because "), proc.stdout
        rest = rest[1:]
    if backend in ("vxlan", "udp"):  # the underlay filter is recommended where it applies
        assert rest[0].startswith("2. [info] encap-filter: "), proc.stdout
        assert "--encap-peers-only" in rest[1], proc.stdout
        rest = rest[2:]
    # Where doctor read the store: from the settings of the flanneld running there.
    assert [line.split(",")[0] for line in rest] == [
        f"store read: etcd {lab.state.etcd_endpoint}"], proc.stdout
    EXTRA.get(backend, lambda lab: None)(lab)


def vxlan_checksum_still_warned_for_a_foreign_random_masquerade(lab: Lab) -> None:
    """A masquerade other than flanneld's with fully-random (kube-proxy's kind) still is."""
    ns = lab.node_ns(1)
    in_ns(ns, "nft", "add", "table", "ip", "opstest")
    in_ns(ns, "nft", "add", "chain", "ip", "opstest", "post",
          "{ type nat hook postrouting priority 100 ; }")
    in_ns(ns, "nft", "add", "rule", "ip", "opstest", "post", "oifname", "nothing-here",
          "masquerade", "fully-random")
    proc = run([*doctor_command(lab, 1), "--json", "--max-age=0"])
    findings = json.loads(proc.stdout)["findings"]
    assert proc.returncode == 1
    assert findings[0]["check"] == "checksum"
    assert findings[0]["what"].startswith(
        "flannel.1 offloads the UDP checksum (tx-checksum-ip-generic on) while this node has "
        "masquerade rules with fully-random")
    assert findings[0]["fix"].startswith(f"{script('flannelctl')} doctor --fix-checksum-offload")


def hostgw_leases_are_listed_by_address(lab: Lab) -> None:
    """Reservations whose text order differs from their address order (.9 < .100)."""
    taken = {subnet(lab, 1), subnet(lab, 2)}
    free = [ipaddress.ip_network(f"10.244.{n}.0/24") for n in (9, 100, 20)]
    assert not taken & set(free)
    endpoint = f"--etcd-endpoints={lab.state.etcd_endpoint}"
    here = ["ip", "netns", "exec", lab.node_ns(1), *FLANNELCTL, "leases"]  # etcd is the lab's
    for net, public in zip(free, ("192.168.111.31", "192.168.111.32", "192.168.111.33"),
                           strict=True):
        proc = run([*here, "reserve", str(net), f"--public-ip={public}", endpoint])
        assert proc.returncode == 0, proc.stderr
    want = sorted([*taken, *free], key=lambda net: int(net.network_address))
    proc = run([*here, "list", endpoint])
    assert proc.returncode == 0, proc.stderr
    *table, said = proc.stdout.splitlines()
    assert [line.split()[0] for line in table[1:]] == [str(n) for n in want]
    assert said.startswith(f"store read: etcd {lab.state.etcd_endpoint}"), said
    proc = run([*here, "list", "--json", endpoint])
    assert [row["subnet"] for row in json.loads(proc.stdout)] == [str(n) for n in want]


def wireguard_printed_command_works_and_cleanup_keeps_to_the_node(lab: Lab) -> None:
    # A blocked WireGuard port fails the pair; the doctor command printed for it, pasted
    # into a shell without the virtualenv on PATH, runs.
    ns2 = lab.node_ns(2)
    in_ns(ns2, "nft", "add", "table", "inet", "opstest")
    try:
        in_ns(ns2, "nft", "add", "chain", "inet", "opstest", "input",
              "{ type filter hook input priority 0 ; }")
        in_ns(ns2, "nft", "add", "rule", "inet", "opstest", "input", "udp", "dport", "51820",
              "drop")
        proc = check_lab(lab)
        assert proc.returncode == 1
        printed = [line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                   if line.startswith("    n1: ")]
        assert printed == [shlex.join(doctor_command(lab, 1, [script("flannelctl")]))]
        pasted = run(shlex.split(printed[0]))
        assert pasted.stderr == ""
        assert pasted.stdout.startswith(("healthy", "unhealthy"))
    finally:
        in_ns(ns2, "nft", "delete", "table", "inet", "opstest")

    # cleanup in the node lists only the node's own things: the host's /run and CNI
    # directories are not the node's, and its own files are found under its --run-dir.
    node = lab.node(1)
    proc = run(["ip", "netns", "exec", node.netns, *FLANNELCTL, "cleanup", "--dry-run",
                "--force"])
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "not looked at: the files under /run and the default CNI directories, which are the "
        "host's: this network namespace is not (give this node's --run-dir, --subnet-file, "
        "--cni-bin-dir, --cni-conf-dir to include its files)")
    assert not [line for line in lines if "/run/" in line or "/etc/" in line
                or "/opt/" in line], proc.stdout
    pid = next(line for line in lines if "wireguard-go process" in line)
    assert pid.endswith("serving flannel-wg (its device goes with it)")
    run_dir = lab.node_run_dir(1)
    proc = run(["ip", "netns", "exec", node.netns, *FLANNELCTL, "cleanup", "--dry-run",
                "--force", f"--run-dir={run_dir}", f"--subnet-file={node.subnet_file}"])
    files = [line.removeprefix("would remove: file ") for line in proc.stdout.splitlines()
             if line.startswith("would remove: file ")]
    assert sorted(files) == sorted([node.subnet_file, str(run_dir / "flannel" / "wgkey"),
                                    str(run_dir / "flannel" / "flannel-wg.log")])


def alivpc_cleanup_takes_nothing_of_the_cloud(lab: Lab) -> None:
    """The backend's routes are in the VPC's table: on the node, cleanup finds no device and
    no route of it, only subnet.env and the --ip-masq chains every backend leaves."""
    node = lab.node(1)
    proc = run(["ip", "netns", "exec", node.netns, *FLANNELCTL, "cleanup", "--dry-run",
                "--force", f"--run-dir={lab.node_run_dir(1)}",
                f"--subnet-file={node.subnet_file}"])
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout
    assert sorted(line for line in proc.stdout.splitlines()
                  if line.startswith("would remove: ")) == [
        f"would remove: file {node.subnet_file}",
        "would remove: iptables-nft filter chain FLANNEL-FWD (and 1 jump rule(s) to it)",
        "would remove: iptables-nft nat chain FLANNEL-POSTRTG (and 1 jump rule(s) to it)"]


EXTRA: dict[str, Callable[[Lab], None]] = {
    "ali-vpc": alivpc_cleanup_takes_nothing_of_the_cloud,
    "vxlan": vxlan_checksum_still_warned_for_a_foreign_random_masquerade,
    "host-gw": hostgw_leases_are_listed_by_address,
    "wireguard": wireguard_printed_command_works_and_cleanup_keeps_to_the_node,
}
