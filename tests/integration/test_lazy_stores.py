"""Each store's client is loaded only in its own mode: kube mode never loads grpc (the etcd
client), etcd mode never loads flanneld's Kubernetes API client (flannel.subnet.kubeclient and
its HTTP, config and credential modules), ``flanneld --version`` loads neither."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tests.support import netns
from tests.support.flanneld import Flanneld
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
ETCD_CLIENT = ("grpc", "aetcd")
KUBE_CLIENT = ("flannel.subnet.kubeclient", "flannel.subnet.kubeconfig",
               "flannel.subnet.kubeauth", "flannel.subnet.kube")

PROBE = """
import sys
from flannel import cli
mode = sys.argv[1]
if mode == "version":
    cli.main(["--version"])
else:
    from flannel import daemon, subnet
    flags = (["--kube-subnet-mgr", "--kube-api-url=http://127.0.0.1:1"] if mode == "kube"
             else ["--etcd-endpoints=http://127.0.0.1:1"])
    manager = subnet.open_store(cli.parse_args(flags, {}).store)
    print(type(manager).__name__)
print(" ".join(sorted(m for m in sys.modules if "." not in m or m.startswith("flannel."))))
"""


def loaded_after(mode: str) -> tuple[str, set[str]]:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                            text=True, timeout=60, check=True, cwd=ROOT)
    lines = result.stdout.splitlines()
    return (lines[0] if len(lines) > 1 else ""), set(lines[-1].split())


def test_kube_mode_construction_never_imports_the_etcd_client():
    manager, modules = loaded_after("kube")
    assert manager == "KubeSubnetManager"
    assert set(KUBE_CLIENT) <= modules
    assert not modules & set(ETCD_CLIENT)
    # PyYAML is for kubeconfig files: --kube-api-url needs none.
    assert "yaml" not in modules


def test_etcd_mode_construction_never_imports_the_kube_client():
    manager, modules = loaded_after("etcd")
    assert manager == "EtcdSubnetManager"
    assert "grpc" in modules
    assert not modules & set(KUBE_CLIENT)


def test_version_imports_no_store_client():
    _, modules = loaded_after("version")
    assert not modules & set(ETCD_CLIENT + KUBE_CLIENT)


def test_a_running_kube_mode_flanneld_has_no_grpc_mapped(ns, tmp_path, monkeypatch):
    """The whole kube-mode daemon (watch, lease, rules) runs without the etcd client: its
    shared objects (grpc's ``cygrpc``) are not mapped into the process."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    api = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.support.kubeapi",
         "--port", "16443", "--node", "node1=10.244.1.0/24"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps({"Network": "10.244.0.0/16", "Backend": {"Type": "alloc"}}))
    env_file = tmp_path / "subnet.env"
    monkeypatch.setenv("NODE_NAME", "node1")
    daemon = Flanneld(tmp_path, ["--kube-subnet-mgr", "--kube-api-url=http://127.0.0.1:16443",
                                 f"--net-config-path={conf}", f"--subnet-file={env_file}",
                                 "--iptables-forward-rules=false"], netns=ns)
    try:
        assert api.stdout.readline().startswith("listening")
        daemon.start()
        wait_until(env_file.exists, 20, what=f"subnet.env in kube mode:\n{daemon.log}")
        maps = Path(f"/proc/{daemon.proc.pid}/maps").read_text()
        assert str(Path(sys.executable).resolve()) in maps  # the probe reads the right process
        grpc_dir = importlib.util.find_spec("grpc").submodule_search_locations[0]
        assert grpc_dir not in maps
    finally:
        daemon.stop()
        api.terminate()
        api.wait(timeout=10)
