"""The Python CNI plugin on the host Pythons it promises to support, without pyenv: Debian 11
(Python 3.9) and Debian 13 (Python 3.13) root filesystems made with debootstrap
(``tests/support/debian_hosts.py``). ``flannelctl install-cni --python /usr/bin/python3``
installs into the host's CNI bin dir; the runtime's call is then made inside that host (a
chroot in its own mount namespace, in a node network namespace) with the real bridge and
host-local plugins of that Debian release: ADD wires a pod namespace, DEL releases it,
broken JSON is code 6."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import debian_hosts, netns
from tests.support.checkout import FLANNELCTL

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.skipif(shutil.which("debootstrap") is None,
                                 reason="needs debootstrap (./install.sh installs it)")]

SUBNET_ENV = ("FLANNEL_NETWORK=10.77.0.0/16\nFLANNEL_SUBNET=10.77.5.1/24\nFLANNEL_MTU=1450\n"
              "FLANNEL_IPMASQ=true\n")
NETCONF = {"cniVersion": "0.3.1", "name": "cbr0", "type": "flannel",
           "delegate": {"hairpinMode": True, "isDefaultGateway": True}}
# Inside the node's mount namespace: the host's /proc and the pod's namespace file, then the
# runtime's call as the host would make it.
CALL = ('mount -t proc proc "$0/proc" && touch "$0/run/pod-netns" '
        '&& mount --bind "$1" "$0/run/pod-netns" && exec chroot "$0" /opt/cni/bin/flannel')


def call(node: str, root: Path, pod: str, command: str, stdin: bytes) -> tuple[int, dict, str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": command,
           "CNI_CONTAINERID": "pod1", "CNI_NETNS": "/run/pod-netns", "CNI_IFNAME": "eth0",
           "CNI_PATH": "/opt/cni/bin:/usr/lib/cni"}
    proc = subprocess.run(["ip", "netns", "exec", node, "unshare", "--mount",
                           "--propagation", "private", "sh", "-c", CALL, str(root),
                           f"/run/netns/{pod}"], input=stdin, env=env, capture_output=True,
                          timeout=60, check=False)
    try:
        answer = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        pytest.fail(f"{command}: not JSON on stdout: {proc.stdout!r} {proc.stderr!r}")
    return proc.returncode, answer, proc.stderr.decode(errors="replace")


@pytest.mark.parametrize("suite", sorted(debian_hosts.SUITES))
def test_plugin_runs_on_the_hosts_own_python(suite, tmp_path):
    root = debian_hosts.extract(suite, tmp_path / "root")
    version = subprocess.run(["chroot", str(root), "/usr/bin/python3", "-c",
                              "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert version.strip() == debian_hosts.SUITES[suite]
    bin_dir = root / "opt" / "cni" / "bin"
    subprocess.run([*FLANNELCTL, "install-cni", "--bin-dir", str(bin_dir), "--conf-dir",
                    str(root / "etc" / "cni" / "net.d"), "--python", "/usr/bin/python3"],
                   check=True, capture_output=True, timeout=120)
    (root / "run" / "flannel").mkdir(parents=True)
    (root / "run" / "flannel" / "subnet.env").write_text(SUBNET_ENV)
    node, pod = netns.create(), netns.create()
    try:
        code, result, said = call(node, root, pod, "ADD", json.dumps(NETCONF).encode())
        assert code == 0, (result, said)
        assert result["ips"][0]["address"] == "10.77.5.2/24"
        assert "inet 10.77.5.2/24" in netns.ip("-4", "addr", "show", "eth0", netns=pod).stdout
        saved = root / "var" / "lib" / "cni" / "flannel" / "pod1"
        assert json.loads(saved.read_text())["ipam"]["ranges"] == [[{"subnet": "10.77.5.0/24"}]]

        code, result, said = call(node, root, pod, "DEL", json.dumps(NETCONF).encode())
        assert (code, result) == (0, {}), said
        assert not saved.exists()
        assert not (root / "var" / "lib" / "cni" / "networks" / "cbr0" / "10.77.5.2").exists()

        code, error, _ = call(node, root, pod, "ADD", b"{")
        assert (code, error["code"]) == (1, 6), error
    finally:
        netns.delete(pod)
        netns.delete(node)
