"""The kustomize base and overlays: they render with kubectl, validate against the Kubernetes
schemas offline, say what kube-flannel v0.28.9 says, and each overlay changes only its part.
deploy/kube-flannel.yml is the rendered base, kept identical to it."""

import copy
import json
import os

import kubernetes_validate
import pytest
import yaml

from flannel.version import __version__
from tests.deploy.manifests import (
    BASE,
    KUBERNETES_VERSIONS,
    KUSTOMIZE,
    OVERLAYS,
    RENDERED,
    documents,
    kustomize,
    load_all,
    pod_spec,
)

pytestmark = pytest.mark.render


def net_conf(docs: dict[str, dict]) -> dict:
    return json.loads(docs["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"])


def volume_paths(docs: dict[str, dict]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec(docs)["volumes"]
            if "hostPath" in v}


def test_rendered_manifest_is_the_base():
    lines = RENDERED.read_text().splitlines(keepends=True)
    header = 0
    while header < len(lines) and lines[header].startswith("#"):
        header += 1
    assert "Generated" in "".join(lines[:header])
    assert "".join(lines[header:]) == kustomize(BASE), (
        "deploy/kube-flannel.yml is out of date: keep its leading comment lines and replace the "
        "rest with the output of `kubectl kustomize deploy/kustomize/base`")


@pytest.mark.parametrize("name", ("base", *OVERLAYS))
def test_renders_and_validates_against_the_schemas(name):
    directory = BASE if name == "base" else KUSTOMIZE / "overlays" / name
    rendered = load_all(kustomize(directory))
    assert len(rendered) == 6
    for version in KUBERNETES_VERSIONS:
        for document in rendered:
            kubernetes_validate.validate(document, version, strict=True)


def test_schema_validation_catches_a_misspelt_field():
    daemonset = copy.deepcopy(documents(BASE)["DaemonSet/kube-flannel-ds"])
    pod_spec({"DaemonSet/kube-flannel-ds": daemonset})["hostNetwrk"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostNetwrk"):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[-1], strict=True)


def test_manifest_holds_what_flanneld_needs():
    with RENDERED.open() as handle:
        kinds = {f"{o['kind']}/{o['metadata']['name']}" for o in load_all(handle.read()) if o}
    assert kinds == {"Namespace/kube-flannel", "ServiceAccount/flannel", "ClusterRole/flannel",
                     "ClusterRoleBinding/flannel", "ConfigMap/kube-flannel-cfg",
                     "DaemonSet/kube-flannel-ds"}


def test_rbac_is_what_flanneld_needs():
    rules = {(tuple(r["resources"]), tuple(r["verbs"]))
             for r in documents(BASE)["ClusterRole/flannel"]["rules"]}
    assert rules == {(("pods",), ("get",)), (("nodes",), ("get", "list", "watch")),
                     (("nodes/status",), ("patch",))}


def test_configmap_is_the_upstream_default():
    docs = documents(BASE)
    assert net_conf(docs) == {"Network": "10.244.0.0/16", "EnableNFTables": False,
                              "Backend": {"Type": "vxlan"}}
    assert json.loads(docs["ConfigMap/kube-flannel-cfg"]["data"]["cni-conf.json"]) == {
        "name": "cbr0", "cniVersion": "0.3.1",
        "plugins": [{"type": "flannel",
                     "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}]}


def test_host_gets_upstreams_static_plugin_and_only_the_conflist_from_us():
    spec = pod_spec(documents(BASE))
    plugin, conflist = spec["initContainers"]
    assert plugin["name"] == "install-cni-plugin"
    assert plugin["image"] == "ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3"
    assert [plugin["command"], plugin["args"]] == [["cp"], ["-f", "/flannel",
                                                            "/opt/cni/bin/flannel"]]
    assert plugin["volumeMounts"] == [{"name": "cni-plugin", "mountPath": "/opt/cni/bin"}]
    assert conflist["name"] == "install-cni"
    # The commands are those of Go flannel's image, which ours has too.
    assert [conflist["command"], conflist["args"]] == [
        ["/opt/bin/install-conf"],
        ["/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"]]
    assert spec["containers"][0]["command"] == ["/opt/bin/flanneld"]
    # The host's CNI bin directory is not visible to pyflannel's init container, so no
    # pod ADD ever depends on the host's Python.
    assert {m["name"] for m in conflist["volumeMounts"]} == {"cni", "flannel-cfg"}
    assert {m["name"] for m in spec["containers"][0]["volumeMounts"]} == {
        "run", "flannel-cfg", "xtables-lock"}


def test_flanneld_container_matches_upstream():
    container = pod_spec(documents(BASE))["containers"][0]
    assert container["args"] == ["--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"]
    assert container["ports"] == [{"name": "healthz", "containerPort": 8081, "protocol": "TCP"}]
    assert container["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "healthz"},
                                          "initialDelaySeconds": 10, "periodSeconds": 30}
    assert container["readinessProbe"] == {"httpGet": {"path": "/readyz", "port": "healthz"},
                                           "initialDelaySeconds": 5, "periodSeconds": 10}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["CONT_WHEN_CACHE_NOT_READY"] == "false"
    assert env["EVENT_QUEUE_DEPTH"] == "5000"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["securityContext"] == {"privileged": False,
                                            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}}


def test_resources_come_from_their_one_file():
    patch = yaml.safe_load((BASE / "resources.yaml").read_text())
    wanted = patch["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert wanted == {"requests": {"cpu": "100m", "memory": "50Mi"}}
    assert pod_spec(documents(BASE))["containers"][0]["resources"] == wanted
    daemonset_text = (BASE / "daemonset.yaml").read_text()
    assert "resources:" not in daemonset_text


def test_image_tag_is_this_version():
    spec = pod_spec(documents(BASE))
    ours = [c["image"] for c in spec["initContainers"][1:] + spec["containers"]]
    assert ours == [f"pyflannel:v{__version__}"] * 2


def test_images_can_point_at_ones_own_registry(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, tmp_path)],
        "images": [{"name": "pyflannel", "newName": "registry.example/net/pyflannel",
                    "newTag": "v9.9.9"},
                   {"name": "ghcr.io/flannel-io/flannel-cni-plugin",
                    "newName": "registry.example/net/flannel-cni-plugin"}]}))
    spec = pod_spec(documents(tmp_path))
    assert [c["image"] for c in spec["initContainers"] + spec["containers"]] == [
        "registry.example/net/flannel-cni-plugin:v1.9.1-flannel3",
        "registry.example/net/pyflannel:v9.9.9", "registry.example/net/pyflannel:v9.9.9"]


def without(docs: dict[str, dict], *, net_conf_too: bool) -> dict[str, dict]:
    """The documents minus what overlays may change (net-conf.json and host paths)."""
    stripped = copy.deepcopy(docs)
    if net_conf_too:
        del stripped["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"]
    del pod_spec(stripped)["volumes"]
    return stripped


@pytest.mark.parametrize(("overlay", "changed"), [
    ("host-gw", {"Backend": {"Type": "host-gw"}}),
    ("dual-stack", {"EnableIPv6": True, "IPv6Network": "2001:cafe:42::/56"}),
    ("nftables", {"EnableNFTables": True}),
])
def test_network_overlays_change_only_net_conf(overlay, changed):
    base = documents(BASE)
    docs = documents(KUSTOMIZE / "overlays" / overlay)
    assert net_conf(docs) == net_conf(base) | changed
    assert without(docs, net_conf_too=True) == without(base, net_conf_too=True)
    assert volume_paths(docs) == volume_paths(base)


def test_k3s_overlay_changes_only_the_cni_directories():
    base = documents(BASE)
    docs = documents(KUSTOMIZE / "overlays" / "k3s")
    assert volume_paths(docs) == volume_paths(base) | {
        "cni-plugin": "/var/lib/rancher/k3s/data/current/bin",
        "cni": "/var/lib/rancher/k3s/agent/etc/cni/net.d"}
    assert without(docs, net_conf_too=False) == without(base, net_conf_too=False)


#: What Go flannel's kustomization (Documentation/kustomization/kube-flannel in v0.28.9, whose
#: commonLabels is k8s-app: flannel) renders: the labels of each object, and the DaemonSet's
#: selector and pod labels. Its plain manifest and its chart select by app: flannel alone.
UPSTREAM_KUSTOMIZATION_LABELS = {
    "Namespace/kube-flannel": {"k8s-app": "flannel",
                               "pod-security.kubernetes.io/enforce": "privileged"},
    "ServiceAccount/flannel": {"k8s-app": "flannel"},
    "ClusterRole/flannel": {"k8s-app": "flannel"},
    "ClusterRoleBinding/flannel": {"k8s-app": "flannel"},
    "ConfigMap/kube-flannel-cfg": {"app": "flannel", "k8s-app": "flannel", "tier": "node"},
    "DaemonSet/kube-flannel-ds": {"app": "flannel", "k8s-app": "flannel", "tier": "node"},
}
UPSTREAM_KUSTOMIZATION_SELECTOR = {"app": "flannel", "k8s-app": "flannel"}
UPSTREAM_KUSTOMIZATION_POD_LABELS = {"app": "flannel", "k8s-app": "flannel", "tier": "node"}


def selector_and_labels(docs: dict[str, dict]) -> tuple[dict, dict, dict]:
    """Takes the labels, the selector and the pod labels out of the documents."""
    daemonset = docs["DaemonSet/kube-flannel-ds"]
    return ({key: doc["metadata"].pop("labels") for key, doc in docs.items()},
            daemonset["spec"].pop("selector"),
            daemonset["spec"]["template"]["metadata"].pop("labels"))


def test_upstream_selector_overlay_keeps_go_flannels_kustomization_selector():
    docs = documents(KUSTOMIZE / "overlays" / "upstream-selector")
    base = documents(BASE)
    labels, selector, pod_labels = selector_and_labels(docs)
    assert labels == UPSTREAM_KUSTOMIZATION_LABELS
    assert selector == {"matchLabels": UPSTREAM_KUSTOMIZATION_SELECTOR}
    assert pod_labels == UPSTREAM_KUSTOMIZATION_POD_LABELS
    # The base's selector is not that one, and a DaemonSet's selector is immutable: applying
    # the base over such a cluster is refused, hence the overlay.
    _, base_selector, _ = selector_and_labels(base)
    assert base_selector == {"matchLabels": {"app": "flannel"}}
    assert docs == base
