"""flannel-lab as an operator runs it: it never builds over a lab, removes only what it
created, says when there is no lab, reads --config as flanneld does, and with the alloc
backend stops at the leases. Also: /readyz says what is wrong, not where."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from flannel.ops.commands import script
from flannel_lab import slowness
from flannel_lab.cli import build
from flannel_lab.cluster import Lab
from tests.support.checkout import FLANNEL_LAB
from tests.support.netns import netns_names
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]


def lab_cli(lab: Lab, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*FLANNEL_LAB, "--root", str(lab.directory.parent), argv[0],
                           "--name", lab.name, *argv[1:]], capture_output=True, text=True,
                          timeout=120, check=False)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process init has not reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def recorded(lab: Lab) -> Lab:
    """The lab as its state file describes it (what a later flannel-lab command sees)."""
    return Lab(lab.name, root=lab.directory.parent)


def test_up_on_an_existing_lab_refuses_and_leaves_it_running(make_lab):
    lab = make_lab()
    first = lab_cli(lab, "up", "--nodes", "2", "--backend", "alloc")
    assert first.returncode == 0, first.stderr
    assert (f"==> lab {lab.name} is up: 2 nodes, leases only: the alloc backend programs no "
            "data path;") in first.stdout
    before = recorded(lab).state
    assert len(recorded(lab).leases()) == 2

    again = lab_cli(lab, "up", "--nodes", "1")
    assert again.returncode == 1
    lab_command = f"{script('flannel-lab')} --root {lab.directory.parent}"
    assert again.stderr == (f"flannel-lab: lab {lab.name} already exists ({lab.directory}); it "
                            f"is left as it is: '{lab_command} down --name {lab.name}' removes "
                            "it\n")
    after = recorded(lab)
    assert after.state == before
    assert set(before.namespaces) <= netns_names()
    assert all(alive(node.pid) for node in before.nodes) and alive(before.etcd_pid)
    assert len(after.leases()) == 2

    ping = lab_cli(lab, "ping")
    assert (ping.returncode, ping.stdout) == (0, (
        f"==> lab {lab.name} uses the alloc backend, which programs no data path: nothing to "
        f"ping; '{lab_command} status --name {lab.name}' shows "
        "the leases\n"))


def test_down_removes_only_what_the_lab_created(make_lab):
    lab = make_lab()
    assert lab_cli(lab, "up", "--nodes", "1", "--backend", "alloc").returncode == 0
    state = recorded(lab).state
    stranger = f"{lab.name}-n9"  # named like the lab's nodes, but not the lab's
    subprocess.run(["ip", "netns", "add", stranger], check=True, timeout=20)
    sleeper = subprocess.Popen(["ip", "netns", "exec", stranger, "sleep", "300"])
    try:
        wait_until(lambda: str(sleeper.pid) in subprocess.run(
            ["ip", "netns", "pids", stranger], capture_output=True, text=True,
            timeout=20).stdout.split(), 10, what="a process in the stranger namespace")
        down = lab_cli(lab, "down")
        assert (down.returncode, down.stdout) == (0, f"==> lab {lab.name} removed\n")
        assert stranger in netns_names() and sleeper.poll() is None
        assert not set(state.namespaces) & netns_names()
        assert not any(alive(n.pid) for n in state.nodes) and not alive(state.etcd_pid)
        assert not lab.directory.exists()
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", stranger], check=False, timeout=20)


def test_up_that_fails_removes_only_what_it_made(make_lab):
    lab = make_lab()
    taken = f"{lab.name}-n2"
    subprocess.run(["ip", "netns", "add", taken], check=True, timeout=20)
    try:
        result = lab_cli(lab, "up", "--nodes", "2", "--backend", "alloc")
        assert result.returncode == 1
        assert result.stderr.startswith(f"flannel-lab: ip netns add {taken}: ")
        assert taken in netns_names()
        assert not {f"{lab.name}-ul", f"{lab.name}-n1"} & netns_names()
        assert not lab.directory.exists()
    finally:
        subprocess.run(["ip", "netns", "del", taken], check=False, timeout=20)


def test_down_of_a_missing_lab_says_so(make_lab, tmp_path):
    lab = make_lab()
    result = lab_cli(lab, "down")
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"==> no lab named {lab.name} under {lab.directory.parent}: nothing to remove\n", "")
    lab.directory.mkdir(parents=True)
    (lab.directory / "notes").write_text("not a lab\n")
    result = lab_cli(lab, "down")
    assert result.returncode == 1
    assert result.stderr == (f"flannel-lab: {lab.directory} holds no lab state; it is left as "
                             "it is (remove it by hand if it is a leftover)\n")
    assert (lab.directory / "notes").read_text() == "not a lab\n"
    (lab.directory / "notes").unlink()
    lab.directory.rmdir()


def test_bad_config_is_refused_before_anything_is_built(make_lab, tmp_path):
    lab = make_lab()
    for config, message in (
            ('{"Network": ', "network config is not valid JSON: Expecting value: line 1 "
                             "column 13 (char 12); a network config is one small JSON object, "
                             'e.g. {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}'),
            ('{"Backend": {"Type": "vxlan"}}', "please define a correct Network parameter in "
             'the flannel config; set "Network" to the cluster CIDR, e.g. 10.244.0.0/16')):
        result = lab_cli(lab, "up", "--config", config)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == f"flannel-lab: --config: {message}\n"
        assert not lab.directory.exists()
    # A file (a path, or @path) is read; its backend options are decoded by the backend's
    # own parser, and refused as flanneld would refuse them, before anything is built.
    path = tmp_path / "net-conf.json"
    for backend, message in (
            ({"Type": "vxaln"}, "unknown backend type: vxaln; set Backend.Type in the network "
                                "config to one of: ali-vpc, alloc, aws-vpc, extension, gce, "
                                "host-gw, ipip, ipsec, tencent-vpc, udp, vxlan, wireguard"),
            ({"Type": "vxlan", "DirectRoutng": True, "VNI": "one"},
             'error decoding VXLAN backend config: VNI must be an integer, got string "one"')):
        path.write_text(json.dumps({"Network": "10.244.0.0/16", "Backend": backend}))
        for given in (str(path), f"@{path}"):
            result = lab_cli(lab, "up", "--config", given)
            assert (result.returncode, result.stdout) == (2, ""), result.stderr
            assert result.stderr.endswith(f"flannel-lab: --config: {message}\n")
            assert not lab.directory.exists()
    assert result.stderr.startswith(
        'flannel-lab: warning: unknown key "DirectRoutng" in Backend is ignored; did you mean '
        '"DirectRouting"?\n')
    result = lab_cli(lab, "up", "--config", str(tmp_path / "missing.json"))
    assert (result.returncode, result.stderr) == (2, (
        f"flannel-lab: --config: cannot read {tmp_path / 'missing.json'}: No such file or "
        "directory; give the JSON text, or a path to a readable file holding it\n"))
    help_text = " ".join(subprocess.run([*FLANNEL_LAB, "up", "--help"], capture_output=True,
                                        text=True, timeout=60, check=True).stdout.split())
    assert "the JSON text, or a file holding it (a path, or @path)" in help_text


def test_config_members_are_case_insensitive_as_for_flanneld(make_lab, tmp_path):
    lab = make_lab()
    path = tmp_path / "net-conf.json"  # --config also takes a file
    path.write_text(json.dumps({"network": "10.244.0.0/16", "backend": {"type": "ALLOC"}}))
    result = lab_cli(lab, "up", "--nodes", "1", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "leases only: the alloc backend programs no data path" in result.stdout
    assert lab_cli(lab, "down").returncode == 0

    dual = make_lab()
    build(dual, 2, json.dumps({"network": "10.244.0.0/16", "enableipv6": True,
                               "ipv6network": "fd00:10:244::/56",
                               "backend": {"type": "vxlan"}}))
    assert dual.state.ipv6
    assert "FLANNEL_IPV6_SUBNET" in dual.wait_subnet_env(1)
    dual.attach_pod_bridge(1)
    dual.attach_pod_bridge(2)
    wait_until(lambda: dual.ping(1, 2, v6=True), 20, what="IPv6 across the overlay")


def test_readyz_names_what_is_wrong_but_no_path(make_lab, tmp_path):
    lab = make_lab()
    lab.create_underlay()
    lab.add_node(1)
    lab.put_config({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}})
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    for name in ("iptables", "iptables-restore", "iptables-save", "nft"):
        (broken / name).write_bytes(b"\x7fELF broken\n")
        os.chmod(broken / name, 0o700)
    lab.start_flanneld(1, "--ip-masq", "--healthz-ip=127.0.0.1", "--healthz-port=8081",
                       env={"PATH": str(broken)})

    def readyz() -> tuple[int, str]:
        return http_get(lab.node_ns(1), "http://127.0.0.1:8081/readyz")

    wait_until(lambda: "traffic rules not installed" in readyz()[1], 20,
               what="503 naming the traffic rules")
    status, body = readyz()
    assert status == 503 and "iptables" in body
    assert str(broken) in lab.log(1)  # the log has the whole story
    assert str(tmp_path) not in body
    assert not re.search(r"(?<![\w.:])/\w", body), body


def test_first_run_up_ping_down_with_wireguard_and_ipv6(make_lab):
    """What an operator sees on a first run: progress that says what it waits for, a ping
    right after 'up' that succeeds (no address of the lab's bridges still tentative), an
    aligned matrix, and a prompt 'down' (wireguard-go included)."""
    lab = make_lab()
    up = lab_cli(lab, "up", "--nodes", "2", "--backend", "wireguard", "--ipv6")
    assert up.returncode == 0, up.stderr
    assert re.search(r"^==> flanneld started on 2/2 nodes \(\d+\.\ds\); waiting until each has "
                     r"leased a subnet and written subnet.env \(\d so far\)$", up.stdout, re.M)
    assert re.search(r"^==> every node has leased a subnet and written subnet.env "
                     r"\(\d+\.\ds\)$", up.stdout, re.M)
    state = recorded(lab).state
    for node in state.nodes:
        tentative = subprocess.run(["ip", "-n", node.netns, "-6", "addr", "show", "dev", "cni0",
                                    "tentative"], capture_output=True, text=True, timeout=20,
                                   check=True).stdout
        assert tentative == "", tentative

    ping = lab_cli(lab, "ping")
    assert (ping.returncode, ping.stderr) == (0, "")
    matrix = ("from\\to  n1    n2\n"
              "n1       -     ok\n"
              "n2       ok    -\n")
    assert ping.stdout == f"IPv4 node ping matrix:\n{matrix}IPv6 node ping matrix:\n{matrix}"

    started = time.monotonic()
    down = lab_cli(lab, "down")
    took = time.monotonic() - started
    assert (down.returncode, down.stdout) == (0, f"==> lab {lab.name} removed\n")
    assert not set(state.namespaces) & netns_names()
    assert not any(alive(node.pid) for node in state.nodes)
    # Not a speed bound (a loaded machine may take seconds): a down that waited for init to
    # reap an exited flanneld (a zombie) would wait out the 10 s it gives each before SIGKILL.
    assert took < slowness.scaled(10), f"down took {took:.1f}s"
