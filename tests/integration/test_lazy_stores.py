"""Each store's client is loaded only in its own mode: kube mode never loads the etcd client,
etcd mode never loads flanneld's Kubernetes API client (flannel.subnet.kubeclient and its
config and credential modules), ``flanneld --version`` loads neither."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ETCD_CLIENT = ("flannel.subnet.etcdclient", "flannel.subnet.etcd")
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
    # ruamel.yaml is for kubeconfig files: --kube-api-url needs none.
    assert "ruamel" not in modules


def test_etcd_mode_construction_never_imports_the_kube_client():
    manager, modules = loaded_after("etcd")
    assert manager == "EtcdSubnetManager"
    assert set(ETCD_CLIENT) <= modules
    assert not modules & set(KUBE_CLIENT)


def test_version_imports_no_store_client():
    _, modules = loaded_after("version")
    assert not modules & set(ETCD_CLIENT + KUBE_CLIENT)
