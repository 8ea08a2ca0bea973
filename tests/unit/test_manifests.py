"""The deployment manifest loads into lightkube's typed models and says what kube-flannel
says (RBAC, ConfigMap keys, probes, environment)."""

import json
from pathlib import Path

from lightkube import codecs

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kube-flannel.yml"


def objects():
    with MANIFEST.open() as handle:
        return {f"{o.kind}/{o.metadata.name}": o for o in codecs.load_all_yaml(handle)}


def test_manifest_loads_into_typed_models():
    assert set(objects()) == {
        "Namespace/kube-flannel", "ServiceAccount/flannel", "ClusterRole/flannel",
        "ClusterRoleBinding/flannel", "ConfigMap/kube-flannel-cfg",
        "DaemonSet/kube-flannel-ds"}


def test_rbac_is_what_flanneld_needs():
    rules = {(tuple(r.resources), tuple(r.verbs)) for r in objects()["ClusterRole/flannel"].rules}
    assert rules == {(("pods",), ("get",)), (("nodes",), ("get", "list", "watch")),
                     (("nodes/status",), ("patch",))}


def test_configmap_is_the_upstream_default():
    data = objects()["ConfigMap/kube-flannel-cfg"].data
    assert json.loads(data["net-conf.json"]) == {"Network": "10.244.0.0/16",
                                                 "EnableNFTables": False,
                                                 "Backend": {"Type": "vxlan"}}
    assert json.loads(data["cni-conf.json"])["name"] == "cbr0"


def test_daemonset_probes_and_env():
    spec = objects()["DaemonSet/kube-flannel-ds"].spec.template.spec
    container = spec.containers[0]
    assert "--kube-subnet-mgr" in container.args
    assert container.livenessProbe.httpGet.path == "/healthz"
    assert container.readinessProbe.httpGet.path == "/readyz"
    assert {e.name for e in container.env} >= {"POD_NAME", "POD_NAMESPACE", "NODE_NAME"}
    assert spec.initContainers[0].args[0] == "install-cni"
    assert spec.hostNetwork is True
