"""A lab node as an operator meets it: ``flannel-lab up --flanneld-arg`` reaches every
node's flanneld (its status lists the flag), and every ``flannelctl`` verb (``status``,
``doctor``, ``check``, ``leases``, ``bundle``) run in a node's namespace with no flags finds
that node's flanneld, its store, its subnet.env and its socket (which also serves /metrics),
and says which store it read; bad extra flags are refused before anything is built."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from flannel.monitor.localsock import connect
from flannel_lab.cli import main as lab_main
from flannel_lab.cluster import Lab

FLANNEL_LAB = str(Path(sys.executable).parent / "flannel-lab")
FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")


def lab_cli(lab: Lab, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLANNEL_LAB, "--root", str(lab.directory.parent), argv[0],
                           "--name", lab.name, *argv[1:]], capture_output=True, text=True,
                          timeout=180, check=False)


def in_node(lab: Lab, index: int, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", lab.node_ns(index), FLANNELCTL, *argv],
                          capture_output=True, text=True, timeout=60, check=False)


class _Local(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=5)
        self.path = path

    def connect(self) -> None:
        self.sock = connect(self.path, 5)


@pytest.mark.netns
@pytest.mark.etcd
def test_flanneld_args_reach_the_nodes_and_the_tools_find_each_node(make_lab):
    lab = make_lab()
    up = lab_cli(lab, "up", "--nodes", "2", "--backend", "alloc",
                 "--flanneld-arg=--iptables-resync=7",
                 "--flanneld-args=-v=1 --reconcile-interval=90")
    assert up.returncode == 0, up.stdout + up.stderr
    recorded = Lab(lab.name, root=lab.directory.parent)
    endpoint = recorded.state.etcd_endpoint
    for index in (1, 2):
        status = in_node(recorded, index, "status", "--json")
        assert status.returncode in (0, 1), status
        doc = json.loads(status.stdout)
        options = {o["name"]: (o["value"], o["source"]) for o in doc["flanneld"]["options"]}
        assert options["iptables-resync"] == ("7", "flag")
        assert options["v"] == ("1", "flag")
        assert options["reconcile-interval"] == ("90", "flag")
        assert options["ip-masq"] == ("true", "flag")
        node = recorded.node(index)
        assert doc["flanneld"]["pid"] == node.pid  # this node's flanneld, not another's
        assert doc["flanneld"]["socket"] == str(Path(node.subnet_file).parent /
                                                "flanneld.sock")
        own = doc["lease"]["subnet"]

        doctor = in_node(recorded, index, "doctor", "--json")
        report = json.loads(doctor.stdout)
        assert [f for f in report["findings"] if f["check"] in (
            "store", "config", "subnet-env", "lease", "flanneld")] == [], report
        assert report["store"] == (f"etcd {endpoint}, prefix /coreos.com/network, from the "
                                   "settings of the flanneld running here; subnet.env "
                                   f"{node.subnet_file}")

        # check, leases and bundle find the same store and subnet.env with no flag.
        source = report["store"]
        check = in_node(recorded, index, "check", "--json")
        assert check.returncode == 0, check
        checked = json.loads(check.stdout)
        assert (checked["node"]["subnet"], checked["store"]) == (own, source)
        assert {peer["verdict"] for peer in checked["peers"]} == {"no-data-path"}
        text = in_node(recorded, index, "check")
        assert text.stdout.endswith(f"\nstore read: {source}\n"), text

        listed = in_node(recorded, index, "leases", "list")
        assert listed.returncode == 0, listed
        rows = listed.stdout.splitlines()
        assert sorted(row.split()[2] for row in rows[1:-1]) == ["192.168.111.11",
                                                                "192.168.111.12"]
        assert rows[-1] == f"store read: {source}"
        shown = in_node(recorded, index, "leases", "show", own, "--json")
        assert json.loads(shown.stdout)["public_ip"] == node.address

        archive = recorded.directory / f"bundle-n{index}.tar.gz"
        bundled = in_node(recorded, index, "bundle", "-o", str(archive))
        assert bundled.returncode == 0, bundled
        assert bundled.stdout.splitlines()[:2] == [
            f"wrote {archive} (22 files, secrets removed)", f"store read: {source}"]
        with tarfile.open(archive) as tar:
            files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
                     for m in tar.getmembers()}
        assert json.loads(files["status.txt"])["flanneld"]["pid"] == node.pid
        assert f'subnet="{own}"' in files["metrics.txt"]
        assert files["subnet.env"] == Path(node.subnet_file).read_text()
        assert files["NOTES.txt"] == "none\n"

        # The node's socket serves /metrics to root, from outside the node too.
        connection = _Local(Path(node.subnet_file).parent / "flanneld.sock")
        try:
            connection.request("GET", "/metrics")
            reply = connection.getresponse()
            body = reply.read().decode()
        finally:
            connection.close()
        assert reply.status == 200
        assert f'subnet="{own}"' in body


@pytest.mark.parametrize(("argv", "said"), [
    (["--flanneld-arg=--no-such-flag"], "flannel-lab: --flanneld-arg: unrecognized "
                                        "arguments: --no-such-flag\n"),
    (["--flanneld-arg=--subnet-file=/tmp/x"], "flannel-lab: --flanneld-arg: --subnet-file "
                                              "cannot be given: the lab sets it for every "
                                              "node\n"),
    (["--flanneld-args=--iptables-resync='5"], "flannel-lab: --flanneld-args "
                                                  "\"--iptables-resync='5\": No closing "
                                                  "quotation\n"),
    (["--flanneld-arg=--healthz-port=99999"], "flannel-lab: --flanneld-arg: "
                                              "--healthz-port=99999: out of acceptable range; "
                                              "give a port from 0 to 65535 (0 turns the "
                                              "health server off)\n"),
])
def test_bad_flanneld_args_are_refused_before_building(tmp_path, capsys, argv, said):
    code = lab_main(["--root", str(tmp_path / "labs"), "up", "--name", "never", *argv])
    assert code == 2
    assert capsys.readouterr().err == said
    assert not (tmp_path / "labs").exists()
