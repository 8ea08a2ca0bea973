"""deploy/chart rendered and linted by Helm's own engine (helm-python-sdk), offline.

What a user of Go flannel's chart (kube-flannel v0.28.9) would notice: every key of that
chart is accepted and sets what it sets there (tests/deploy/chart_values/upstream-*.yaml are
the facts), the default rendering is the kustomize base but for what the values imply, every
rendering passes the Kubernetes schemas strictly, and net-conf.json decodes with flanneld's
own parsers to the backend options the values asked for.
"""

from __future__ import annotations

import copy
import json
from ipaddress import IPv4Network, IPv6Network
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from flannel import backend as backends
from flannel.backend.ipip import IpipConfig
from flannel.backend.udp import UdpConfig
from flannel.backend.vxlan import VxlanConfig
from flannel.config import parse_config
from flannel.extension.peers import ExtensionConfig
from flannel.ipsec.config import IpsecConfig
from flannel.version import __version__
from flannel.wireguard.config import WireguardConfig
from tests.deploy.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    VALUES,
    chart_metadata,
    chart_schema,
    chart_values,
    lint,
    notes,
    render,
    render_text,
    values_file,
)
from tests.deploy.manifests import BASE, KUBERNETES_VERSIONS, documents, pod_spec

pytestmark = pytest.mark.render

DEFAULT_NET = {"Network": "10.244.0.0/16", "EnableNFTables": False}
EXTENSION_DIR = "/usr/local/lib/flannel/extension-vxlan/"
TEST_PSK = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

#: Each values file and the net-conf.json it must give.
NET_CONF: dict[str, dict[str, Any]] = {
    "vxlan": DEFAULT_NET | {"Backend": {
        "Type": "vxlan", "Port": 4789, "VNI": 4096, "GBP": True, "DirectRouting": True,
        "MTU": 9000, "MacPrefix": "0E-2A"}},
    "host-gw": DEFAULT_NET | {"Backend": {"Type": "host-gw"}},
    "udp": DEFAULT_NET | {"Backend": {"Type": "udp", "Port": 8286}},
    "wireguard": DEFAULT_NET | {
        "IPv6Network": "fd00:10:244::/56", "EnableIPv6": True,
        "Backend": {"Type": "wireguard", "ListenPort": 51830, "ListenPortV6": 51831,
                    "PSK": TEST_PSK, "MTU": 1500, "Mode": "auto",
                    "PersistentKeepaliveInterval": 25}},
    "ipip": DEFAULT_NET | {"Backend": {"Type": "ipip", "DirectRouting": True}},
    "extension": DEFAULT_NET | {"Backend": {
        "Type": "extension",
        "PreStartupCommand": EXTENSION_DIR + "pre-startup eth0",
        "PostStartupCommand": EXTENSION_DIR + "post-startup",
        "SubnetAddCommand": EXTENSION_DIR + "subnet-add",
        "SubnetRemoveCommand": EXTENSION_DIR + "subnet-remove", "EncapOverhead": 50}},
    "alloc": DEFAULT_NET | {"Backend": {"Type": "alloc"}},
    "aws-vpc": DEFAULT_NET | {"Backend": {"Type": "aws-vpc",
                                          "RouteTableID": "rtb-0123456789abcdef0"}},
    "tencent-vpc": DEFAULT_NET | {"Backend": {"Type": "tencent-vpc"}},
    "ali-vpc": DEFAULT_NET | {"Backend": {"Type": "ali-vpc"}},
    "dual-stack": DEFAULT_NET | {"IPv6Network": "2001:cafe:42::/56", "EnableIPv6": True,
                                 "Backend": {"Type": "vxlan"}},
    "ipv6-only": {"EnableIPv4": False, "IPv6Network": "fd00:10:244::/56", "EnableIPv6": True,
                  "EnableNFTables": False, "Backend": {"Type": "vxlan"}},
    "nftables": DEFAULT_NET | {"EnableNFTables": True, "Backend": {"Type": "vxlan"}},
    "netpol": DEFAULT_NET | {"Backend": {"Type": "vxlan"}},
    "k3s": DEFAULT_NET | {"Network": "10.42.0.0/16", "Backend": {"Type": "vxlan"}},
    "upstream-defaults": DEFAULT_NET | {"Backend": {"Type": "vxlan"}},
    "upstream-documented": DEFAULT_NET | {"Backend": {
        "Type": "vxlan", "VNI": 1, "MTU": 1500, "MacPrefix": "0E-2A"}},
}


def test_every_values_file_is_listed():
    assert sorted(p.stem for p in VALUES.glob("*.yaml")) == sorted(NET_CONF)


def net_conf(docs: dict[str, dict]) -> dict[str, Any]:
    return json.loads(docs["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"])


def cni_conf(docs: dict[str, dict]) -> dict[str, Any]:
    return json.loads(docs["ConfigMap/kube-flannel-cfg"]["data"]["cni-conf.json"])


def container(docs: dict[str, dict], name: str) -> dict[str, Any]:
    spec = pod_spec(docs)
    return next(c for c in spec["initContainers"] + spec["containers"] if c["name"] == name)


@pytest.mark.parametrize("name", ["default", *NET_CONF])
def test_lints_clean(name):
    report = lint(None if name == "default" else values_file(name))
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); 2 and 3 are warnings and errors.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_a_broken_value():
    report = lint({"flannel": {"backend": "vxlan-typo"}})
    assert any("backend" in m["error"] for m in report["messages"] if m["severity"] == 3)


@pytest.mark.parametrize("name", ["default", *NET_CONF])
def test_renders_and_validates_against_the_schemas(name):
    docs = render(None if name == "default" else values_file(name))
    assert set(docs) == {"ServiceAccount/flannel", "ClusterRole/flannel",
                         "ClusterRoleBinding/flannel", "ConfigMap/kube-flannel-cfg",
                         "DaemonSet/kube-flannel-ds"}
    for version in KUBERNETES_VERSIONS:
        for document in docs.values():
            kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("name", NET_CONF)
def test_net_conf_is_what_the_values_ask_for(name):
    assert net_conf(render(values_file(name))) == NET_CONF[name]


def test_default_net_conf():
    assert net_conf(render()) == DEFAULT_NET | {"Backend": {"Type": "vxlan"}}


@pytest.mark.parametrize("name", NET_CONF)
def test_net_conf_decodes_with_flanneld_parsers(name):
    text = render(values_file(name))["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"]
    cfg = parse_config(text)
    wanted = NET_CONF[name]
    assert cfg.backend_type == wanted["Backend"]["Type"]
    assert cfg.backend == wanted["Backend"]
    assert cfg.enable_ipv4 == ("Network" in wanted)
    assert cfg.network == (IPv4Network(wanted["Network"]) if "Network" in wanted else None)
    assert cfg.enable_ipv6 == ("IPv6Network" in wanted)
    assert cfg.ipv6_network == (IPv6Network(wanted["IPv6Network"])
                                if "IPv6Network" in wanted else None)
    assert cfg.enable_nftables == wanted["EnableNFTables"]
    backends.backend_class(cfg.backend_type)  # flanneld has this backend


def test_backend_options_decode_as_asked():
    def backend(name: str) -> dict[str, Any]:
        return parse_config(render(values_file(name))["ConfigMap/kube-flannel-cfg"]["data"]
                            ["net-conf.json"]).backend

    assert VxlanConfig.from_backend(backend("vxlan")) == VxlanConfig(
        vni=4096, port=4789, mtu=9000, gbp=True, direct_routing=True)
    assert VxlanConfig.from_backend(backend("upstream-documented")) == VxlanConfig(vni=1, mtu=1500)
    assert UdpConfig.from_backend(backend("udp")).port == 8286
    wireguard = WireguardConfig.from_backend(backend("wireguard"))
    assert (wireguard.listen_port, wireguard.listen_port_v6, wireguard.mtu,
            wireguard.keepalive, wireguard.mode) == (51830, 51831, 1500, 25, "auto")
    assert wireguard.psk is not None
    assert IpipConfig.from_backend(backend("ipip")) == IpipConfig(direct_routing=True)
    psk = "p" * 96
    ipsec = IpsecConfig.from_backend(parse_config(render(
        {"flannel": {"backend": "ipsec", "psk": psk, "backendConfig": {"UDPEncap": True}}})
        ["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"]).backend)
    assert (ipsec.psk, ipsec.udp_encap) == (psk, True)
    assert ExtensionConfig.from_backend(backend("extension")) == ExtensionConfig(
        pre_startup=EXTENSION_DIR + "pre-startup eth0", post_startup=EXTENSION_DIR + "post-startup",
        subnet_add=EXTENSION_DIR + "subnet-add", subnet_remove=EXTENSION_DIR + "subnet-remove",
        encap_overhead=50)


@pytest.mark.parametrize("mode", ["separate", "auto", "ipv4", "ipv6"])
def test_tunnel_mode_is_valid_json(mode):
    """Go flannel's chart writes tunnelMode unquoted ("Mode": auto), which no JSON parser
    accepts, so flanneld cannot start; here it is a JSON string flanneld decodes."""
    docs = render({"flannel": {"backend": "wireguard", "tunnelMode": mode}})
    assert WireguardConfig.from_backend(parse_config(
        docs["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"]).backend).mode == mode


def test_default_rendering_is_the_kustomize_base():
    """Object by object, the chart's defaults are deploy/kustomize/base, except for what is
    listed here: each difference is asserted, then taken out, and the rest must be equal."""
    chart, base = render(), documents(BASE)
    # Helm installs into an existing namespace (--namespace, --create-namespace), as Go
    # flannel's chart does: a Namespace object would make `helm upgrade` from that chart
    # refuse to take over the namespace it does not own.
    assert set(base) - set(chart) == {"Namespace/kube-flannel"}
    del base["Namespace/kube-flannel"]
    for docs in (chart, base):
        data = docs["ConfigMap/kube-flannel-cfg"]["data"]
        for key in data:
            data[key] = json.loads(data[key])
    # The default tolerations are Go flannel's chart's (NoExecute too); the base keeps its
    # plain manifest's (NoSchedule only).
    assert pod_spec(chart).pop("tolerations") == [{"effect": "NoExecute", "operator": "Exists"},
                                                  {"effect": "NoSchedule", "operator": "Exists"}]
    assert pod_spec(base).pop("tolerations") == [{"operator": "Exists", "effect": "NoSchedule"}]
    assert set(chart) == set(base)
    for key in base:
        assert chart[key] == base[key], key


def test_selector_is_go_flannel_charts():
    """`helm upgrade` from Go flannel's chart keeps the DaemonSet only if the selector is the
    same: app=flannel alone (its plain manifest selects the same way)."""
    daemonset = render()["DaemonSet/kube-flannel-ds"]
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app": "flannel"}}
    assert daemonset["spec"]["template"]["metadata"]["labels"] == {"tier": "node",
                                                                   "app": "flannel"}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_every_upstream_key_has_upstreams_default():
    ours = flatten(chart_values())
    for name in ("upstream-defaults", "upstream-documented"):
        missing = set(flatten(values_file(name))) - set(ours)
        assert not missing, f"keys of Go flannel's chart missing from values.yaml: {missing}"
    differ = {key: (value, ours[key]) for key, value in flatten(
        values_file("upstream-defaults")).items() if value != ours[key]}
    # The image (ours), an empty list for "no secrets", and the same conflist JSON written
    # out on several lines.
    assert set(differ) == {"flannel.image.repository", "flannel.image.tag",
                           "global.imagePullSecrets", "flannel.cniConf"}
    assert differ["global.imagePullSecrets"] == (None, [])
    assert json.loads(differ["flannel.cniConf"][0]) == json.loads(differ["flannel.cniConf"][1])


def comparable(docs: dict[str, dict]) -> dict[str, dict]:
    docs = copy.deepcopy(docs)
    data = docs["ConfigMap/kube-flannel-cfg"]["data"]
    data["cni-conf.json"] = json.loads(data["cni-conf.json"])
    return docs


def test_upstream_values_file_installs_the_same_cluster():
    """Go flannel's chart's own defaults, given as a values file: the same objects as this
    chart's defaults, flanneld's image aside (a values file that names Go flannel's image
    keeps running it: the chart uses only the paths both images have)."""
    upstream = values_file("upstream-defaults")
    docs = render(upstream)
    spec = pod_spec(docs)
    images = [c["image"] for c in spec["initContainers"] + spec["containers"]]
    assert images == ["ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3",
                      "ghcr.io/flannel-io/flannel:v0.28.9", "ghcr.io/flannel-io/flannel:v0.28.9"]
    del upstream["flannel"]["image"]
    assert comparable(render(upstream)) == comparable(render())
    assert "Go flannel's image" in notes(values_file("upstream-defaults"))
    assert "Go flannel's image" not in notes()


def test_image_defaults_to_this_version():
    assert chart_metadata()["appVersion"] == f"v{__version__}"
    assert chart_metadata()["version"] == __version__
    spec = pod_spec(render())
    images = [c["image"] for c in spec["initContainers"] + spec["containers"]]
    assert images == ["ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3",
                      f"pyflannel:v{__version__}", f"pyflannel:v{__version__}"]


def test_backend_types_are_the_ones_flanneld_has():
    enum = chart_schema()["properties"]["flannel"]["properties"]["backend"]["enum"]
    assert sorted(enum) == backends.supported()


def test_dual_stack_matches_the_kustomize_overlay():
    overlay = documents(BASE.parent / "overlays" / "dual-stack")
    assert net_conf(render(values_file("dual-stack"))) == json.loads(
        overlay["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"])


def test_nftables_matches_the_kustomize_overlay():
    overlay = documents(BASE.parent / "overlays" / "nftables")
    assert net_conf(render(values_file("nftables"))) == json.loads(
        overlay["ConfigMap/kube-flannel-cfg"]["data"]["net-conf.json"])


def host_paths(docs: dict[str, dict]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec(docs)["volumes"]
            if "hostPath" in v}


def test_cni_directories_are_the_host_paths():
    assert host_paths(render(values_file("k3s"))) == host_paths(
        documents(BASE.parent / "overlays" / "k3s"))


def test_netpol_adds_the_controller_and_its_rights():
    default, docs = render(), render(values_file("netpol"))
    netpol = container(docs, "kube-network-policies")
    assert netpol["image"] == "registry.k8s.io/networking/kube-network-policies:v1.0.0"
    assert [netpol["command"], netpol["args"]] == [
        ["/bin/netpol"], ["--hostname-override=$(MY_NODE_NAME)", "--v=2"]]
    assert netpol["env"] == [{"name": "MY_NODE_NAME",
                              "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    assert netpol["volumeMounts"] == [{"name": "lib-modules", "mountPath": "/lib/modules",
                                       "readOnly": True}]
    assert host_paths(docs) == host_paths(default) | {"lib-modules": "/lib/modules"}
    granted = {(group, resource, verb)
               for rule in docs["ClusterRole/flannel"]["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    for resource in ("pods", "namespaces", "nodes"):
        assert {("", resource, "list"), ("", resource, "watch")} <= granted
    for group, resource in (("networking.k8s.io", "networkpolicies"),
                            ("policy.networking.k8s.io", "adminnetworkpolicies"),
                            ("policy.networking.k8s.io", "baselineadminnetworkpolicies")):
        assert {(group, resource, "list"), (group, resource, "watch")} <= granted
    assert default["ClusterRole/flannel"]["rules"] == documents(BASE)["ClusterRole/flannel"][
        "rules"]


def test_pod_placement_and_pull_values():
    docs = render({"global": {"imagePullSecrets": [{"name": "regcred"}]},
                   "flannel": {"tolerations": [{"key": "dedicated", "operator": "Equal",
                                                "value": "net", "effect": "NoExecute"}],
                               "nodeSelector": {"flannel": "yes"},
                               "resources": {"limits": {"memory": "200Mi"}},
                               "args": ["--ip-masq", "--kube-subnet-mgr", "--iface=eth1"]}})
    spec = pod_spec(docs)
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "net",
                                    "effect": "NoExecute"}]
    assert spec["nodeSelector"] == {"flannel": "yes"}
    flanneld = container(docs, "kube-flannel")
    # Maps merge with the defaults, as in every Helm chart.
    assert flanneld["resources"] == {"requests": {"cpu": "100m", "memory": "50Mi"},
                                     "limits": {"memory": "200Mi"}}
    assert flanneld["args"] == ["--ip-masq", "--kube-subnet-mgr", "--iface=eth1",
                                "--healthz-port=8081"]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(docs["DaemonSet/kube-flannel-ds"], version, strict=True)


def test_healthz_port_moves_the_server_and_probes():
    docs = render({"flannel": {"healthz": {"port": 9091,
                                           "livenessProbe": {"timeoutSeconds": 3}}}})
    flanneld = container(docs, "kube-flannel")
    assert flanneld["args"][-1] == "--healthz-port=9091"
    assert flanneld["ports"] == [{"name": "healthz", "containerPort": 9091, "protocol": "TCP"}]
    assert flanneld["livenessProbe"]["timeoutSeconds"] == 3


def test_healthz_port_zero_turns_the_server_off():
    flanneld = container(render({"flannel": {"healthz": {"port": 0}}}), "kube-flannel")
    assert flanneld["args"] == ["--ip-masq", "--kube-subnet-mgr"]
    assert not {"ports", "livenessProbe", "readinessProbe"} & set(flanneld)


def test_skip_cni_config_installation_drops_the_conflist_installer():
    spec = pod_spec(render({"flannel": {"skipCNIConfigInstallation": True}}))
    assert [c["name"] for c in spec["initContainers"]] == ["install-cni-plugin"]


@pytest.mark.parametrize(("values", "key"), [
    ({"flannel": {"backend": "VXLAN"}}, "/flannel/backend"),
    ({"flannel": {"backend": "geneve"}}, "/flannel/backend"),
    ({"flannel": {"tunnelMode": "both"}}, "/flannel/tunnelMode"),
    ({"flannel": {"backendPort": 70000}}, "/flannel/backendPort"),
    ({"flannel": {"vni": "four"}}, "/flannel/vni"),
    ({"flannel": {"GBP": "yes"}}, "/flannel/GBP"),
    ({"flannel": {"cniBinDir": "opt/cni/bin"}}, "/flannel/cniBinDir"),
])
def test_wrong_values_are_refused_naming_the_key(values, key):
    with pytest.raises(helm.HelmValuesError, match=key):
        render(values)


@pytest.mark.parametrize(("values", "message"), [
    ({"flannel": {"vni": 7, "backendConfig": {"vni": 8}}},
     "backendConfig.vni: VNI is already set"),
    ({"flannel": {"backendConfig": {"TYPE": "host-gw"}}},
     "the backend type is flannel.backend"),
    ({"flannel": {"cniConf": "{\"name\": "}}, "flannel.cniConf is not a JSON object"),
])
def test_conflicting_or_broken_values_fail_the_render(values, message):
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


def test_set_string_values_mean_what_they_say():
    """`--set-string` gives strings: numbers and booleans still mean the same, and "false"
    is false (Go flannel's chart takes any non-empty string as true, so there
    enableNFTables="false" turns nftables on)."""
    as_strings = helm.parse_set_string_values(
        "flannel.backendPort=4789,flannel.vni=2,flannel.GBP=false,flannel.enableNFTables=false,"
        "flannel.healthz.port=8081,flannel.skipCNIConfigInstallation=false")
    docs = render(as_strings)
    assert net_conf(docs) == DEFAULT_NET | {"Backend": {"Type": "vxlan", "Port": 4789,
                                                        "VNI": 2}}
    assert [c["name"] for c in pod_spec(docs)["initContainers"]] == ["install-cni-plugin",
                                                                     "install-cni"]


def test_readme_lists_every_value():
    readme = (CHART / "README.md").read_text()
    for key in flatten(chart_values()):
        top = key.split(".")[:2] if key.startswith("flannel.") else key.split(".")[:1]
        assert f"`{'.'.join(top)}" in readme, key



def test_update_strategy_can_wait_for_each_node():
    docs = render({"flannel": {"updateStrategy": {"type": "OnDelete"}}})
    assert docs["DaemonSet/kube-flannel-ds"]["spec"]["updateStrategy"] == {"type": "OnDelete"}
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(docs["DaemonSet/kube-flannel-ds"], version, strict=True)


def test_packaged_chart_renders_the_same(tmp_path):
    """`helm package` (what a chart repository serves) keeps everything the chart needs:
    the archive renders what the directory renders, schema included."""
    archive = helm.package(CHART, destination=tmp_path)
    assert archive.endswith(f"pyflannel-{__version__}.tgz")
    values = values_file("wireguard")
    with helm.Chart.load(archive) as packaged:
        assert packaged.schema == chart_schema()
        rendered = packaged.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert rendered == render_text(values)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_lints_clean_for_each_kubernetes_version(version):
    report = helm.lint(CHART, {}, strict=True, kube_version=f"v{version}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
