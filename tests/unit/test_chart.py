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
import random
import re
import shlex
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from flannel import backend as backends
from flannel.backend.ipip import IpipConfig
from flannel.backend.udp import UdpConfig
from flannel.backend.vxlan import VxlanConfig
from flannel.config import ConfigError, check_network_config, parse_config
from flannel.extension.peers import ExtensionConfig
from flannel.flags import FLAGS
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
    refusals,
    render,
    render_text,
    values_file,
)
from tests.deploy.manifests import BASE, KUBERNETES_VERSIONS, ROOT, documents, pod_spec

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
    # The pod networks: CIDRs of their family, with a prefix flanneld takes (its subnets
    # need room: /28 at most for IPv4, /124 for IPv6; /0 is no network).
    ({"podCidr": "not-a-cidr"}, "/podCidr"),
    ({"podCidr": "10.42.0.0/33"}, "/podCidr"),
    ({"podCidr": "10.42.0.0/29"}, "/podCidr"),
    ({"podCidr": "0.0.0.0/0"}, "/podCidr"),
    ({"podCidr": "256.42.0.0/16"}, "/podCidr"),
    ({"podCidr": "010.42.0.0/16"}, "/podCidr"),
    ({"podCidr": "10.42.0.0/016"}, "/podCidr"),
    ({"podCidr": "10.42.0.0/255.255.0.0"}, "/podCidr"),
    ({"podCidr": "10.42.0.0"}, "/podCidr"),
    ({"podCidr": " 10.42.0.0/16"}, "/podCidr"),
    ({"podCidr": "fd00:10:244::/56"}, "/podCidr"),
    ({"podCidrv6": "10.42.0.0/16"}, "/podCidrv6"),
    ({"podCidrv6": "fd00:10:244::/129"}, "/podCidrv6"),
    ({"podCidrv6": "fd00:10:244::/125"}, "/podCidrv6"),
    ({"podCidrv6": "fd00::10::244/56"}, "/podCidrv6"),
    ({"podCidrv6": "fd00:10:244::%eth0/56"}, "/podCidrv6"),
    # Numbers in range, also as the strings --set-string gives (a leading 0 would be read
    # as octal by the template: "010" is 8).
    ({"flannel": {"backendPort": "70000"}}, "/flannel/backendPort"),
    ({"flannel": {"backendPort": "08472"}}, "/flannel/backendPort"),
    ({"flannel": {"backendPortv6": -1}}, "/flannel/backendPortv6"),
    ({"flannel": {"vni": 16777216}}, "/flannel/vni"),
    ({"flannel": {"vni": "010"}}, "/flannel/vni"),
    ({"flannel": {"keepaliveInterval": 65536}}, "/flannel/keepaliveInterval"),
    ({"flannel": {"healthz": {"port": "65536"}}}, "/flannel/healthz/port"),
    # What each backend makes of a value, as its own option decoder checks it.
    ({"flannel": {"mtu": 117}}, "/flannel/mtu"),
    ({"flannel": {"mtu": "100"}}, "/flannel/mtu"),
    ({"flannel": {"backend": "wireguard", "mtu": 1279}}, "/flannel/mtu"),
    ({"flannel": {"backend": "wireguard", "mtu": "1000"}}, "/flannel/mtu"),
    ({"flannel": {"backend": "wireguard", "psk": "not-a-key"}}, "/flannel/psk"),
    ({"flannel": {"backend": "wireguard", "psk": TEST_PSK[:-2] + "=="}}, "/flannel/psk"),
    ({"flannel": {"backend": "ipsec", "psk": "p" * 95}}, "/flannel/psk"),
    ({"flannel": {"backend": "ipsec", "psk": "p" * 4097}}, "/flannel/psk"),
    ({"flannel": {"updateStrategy": {"type": "Recreate"}}}, "/flannel/updateStrategy/type"),
    ({"netpol": {"enabled": "yes"}}, "/netpol/enabled"),
])
def test_wrong_values_are_refused_naming_the_key(values, key):
    with pytest.raises(helm.HelmValuesError, match=f"at '{key}'"):
        render(values)


@pytest.mark.parametrize(("values", "where", "key"), [
    ({"flannel": {"backned": "host-gw"}}, "/flannel", "backned"),
    ({"podCIDR": "10.42.0.0/16"}, "", "podCIDR"),
    ({"flanel": {"backend": "host-gw"}}, "", "flanel"),
    ({"flannel": {"image": {"repository": "r", "tag": "t", "pullPolicy": "Always"}}},
     "/flannel/image", "pullPolicy"),
    ({"flannel": {"flannel_cni": {"imag": {}}}}, "/flannel/flannel_cni", "imag"),
    ({"flannel": {"healthz": {"prot": 8081}}}, "/flannel/healthz", "prot"),
    ({"flannel": {"updateStrategy": {"tpye": "OnDelete"}}}, "/flannel/updateStrategy", "tpye"),
    ({"netpol": {"enable": True}}, "/netpol", "enable"),
    ({"netpol": {"image": {"repository": "r", "tag": "t", "digest": "d"}}}, "/netpol/image",
     "digest"),
])
def test_unknown_keys_are_refused_naming_them(values, where, key):
    """A typo fails `helm install` (and template, lint) instead of being ignored."""
    with pytest.raises(helm.HelmValuesError,
                       match=re.escape(f"at '{where}': additional properties '{key}' not "
                                       "allowed")):
        render(values)
    report = lint(values)
    assert any(f"additional properties '{key}' not allowed" in error
               for error in report["errors"]), report


@pytest.mark.parametrize("values", [
    {"podCidr": "10.42.0.0/16"}, {"podCidr": "10.42.0.0/28"}, {"podCidr": "192.168.7.0/24"},
    {"podCidr": "10.42.0.1/16"},
    {"podCidr": "", "podCidrv6": "fd00:10:244::/56"},
    {"podCidrv6": "2001:DB8:42::/124"}, {"podCidrv6": "::ffff:10.0.0.0/104"},
    {"flannel": {"backendPort": "4789", "vni": 16777215, "mtu": 118}},
    {"flannel": {"backend": "wireguard", "mtu": "1280", "psk": 0, "keepaliveInterval": 65535}},
    {"flannel": {"backend": "wireguard", "psk": TEST_PSK}},
    {"flannel": {"backend": "ipsec", "psk": "p" * 96}},
    {"flannel": {"backend": "ipsec", "backendConfig": {"PSK": "p" * 96}}},
    {"flannel": {"backend": "host-gw", "mtu": 100}},  # host-gw has no MTU: left out
    {"flannel": {"updateStrategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxUnavailable": 2}}}},
    {"flannel": {"args": ["--ip-masq", "--kube-subnet-mgr", "-iface", "eth1", "--v=2",
                          "-help"]}},
    {"flannel": {"healthz": {"port": 0}, "args": ["--healthz-port=9000"]}},
    {"global": {"imagePullSecrets": [{"name": "s"}], "imageRegistry": "for-other-charts"}},
])
def test_values_flanneld_takes_render(values):
    render(values)


def flanneld_takes(field: str, text: str) -> bool | None:
    """Whether flanneld starts with this pod network (None: only because it overlaps a range
    it keeps pods out of, which the schema leaves to it), written as Go's ParseCIDR reads
    one too: a decimal prefix without leading zeros, no netmask."""
    conf: dict[str, Any] = {"Network": text} if field == "podCidr" else {
        "EnableIPv4": False, "IPv6Network": text, "EnableIPv6": True}
    try:
        check_network_config(parse_config(json.dumps(conf)))
    except ConfigError as err:
        return None if "overlaps" in err.describe() else False
    return re.fullmatch(r"[^/]+/(0|[1-9][0-9]*)", text) is not None


def cidr_corpus(seed: int = 31) -> list[tuple[str, str]]:
    """(field, text): pod networks of both families, written every way flanneld's parser
    takes them and with the mistakes people make, prefixes around every limit."""
    rng = random.Random(seed)
    prefixes4 = [0, 1, 8, 8, 16, 16, 22, 24, 24, 28, 28, 29, 32, 33, 99]
    prefixes6 = [0, 1, 48, 56, 64, 100, 124, 125, 128, 129, 1000]
    out: list[tuple[str, str]] = []
    for _ in range(300):
        octets = [rng.choice([10, 172, 192, 100, 44, 10, 172, 192, 100, 44, 256, 300, 0, 127]),
                  *(rng.choice([0, 1, 9, 10, 99, 100, 199, 200, 249, 250, 255, 0, 1, 256])
                    for _ in range(3))]
        text = ".".join(str(o) for o in octets)
        variant = rng.randrange(12)
        if variant == 0:
            text = ".".join(rng.choice([str(o), f"0{o}"]) for o in octets)
        elif variant == 1:
            text = ".".join(str(o) for o in octets[:rng.choice([3, 5])])
            text += ".1" if text.count(".") == 2 else ""
        prefix = rng.choice(prefixes4)
        suffix = rng.choice([f"/{prefix}", f"/{prefix}", f"/0{prefix}", "", "/", "/x",
                             "/255.255.0.0"]) if variant == 2 else f"/{prefix}"
        out.append(("podCidr", text + suffix))
    for _ in range(240):
        value = rng.getrandbits(128)
        groups = [(value >> (16 * i)) & 0xFFFF for i in reversed(range(8))]
        for i in rng.sample(range(8), rng.randrange(8)):  # runs of zeros to compress
            groups[i] = 0
        groups[0] = rng.choice([0xfd00, 0x2001, 0xfd00, 0x2001, groups[0], 0, 0xfe80, 0xff02])
        address = IPv6Address(sum(g << (16 * (7 - i)) for i, g in enumerate(groups)))
        variant = rng.randrange(10)
        if variant == 0:
            text = address.exploded
        elif variant == 1:
            text = ":".join(f"{g:x}" for g in groups)
        elif variant == 2:
            text = str(address).upper()
        elif variant == 3:  # the last 32 bits as an IPv4 address
            head = str(IPv6Address(int(address) & ~0xFFFFFFFF)).rstrip(":")
            tail = IPv4Address(int(address) & 0xFFFFFFFF)
            text = f"{head}:{tail}" if head.endswith(":") or head.count(":") >= 6 \
                else f"{head}::{tail}" if "::" not in head else f"{head}:{tail}"
        elif variant == 4:  # a mistake
            text = rng.choice([str(address) + ":", str(address).replace(":", ":::", 1),
                               ":".join(f"{g:x}" for g in [*groups[:rng.choice([7, 9])], 1]),
                               str(address).replace(":", ":12345:", 1),
                               str(address) + "::1" if "::" in str(address) else "g::1",
                               f"{address}%eth0", str(IPv4Address(value & 0xFFFFFFFF))])
        else:
            text = str(address)
        out.append(("podCidrv6", f"{text}/{rng.choice(prefixes6)}"))
    for text in ("fd00:10:244::/56", "::/1", "1::/16", "1:2:3:4:5:6:7::/64",
                 "::2:3:4:5:6:7:8/64", "1::8/64", "::ffff:10.0.0.0/104", "1:2:3:4:5:6:1.2.3.4/96",
                 "1::1.2.3.4/64", "1:2:3:4:5::1.2.3.4/64", "1:2:3:4:5:6::1.2.3.4/64",
                 "1:2:3:4:5:6:7:1.2.3.4/64", "::1.2.3.04/96", "::256.2.3.4/96"):
        out.append(("podCidrv6", text))
    return out


def test_pod_networks_are_taken_exactly_when_flanneld_takes_them():
    """Through Helm's engine (Go's regular expressions): podCidr and podCidrv6 render exactly
    when flanneld would start with them, for every text of the corpus but those flanneld
    refuses only for overlapping a reserved range (loopback, link-local, multicast)."""
    cases = [(field, text, flanneld_takes(field, text)) for field, text in cidr_corpus()]
    cases = [(field, text, takes) for field, text, takes in cases if takes is not None]
    for family in ("podCidr", "podCidrv6"):
        verdicts = [takes for field, _, takes in cases if field == family]
        assert verdicts.count(True) >= 50 and verdicts.count(False) >= 100, family
    refused = refusals({"podCidr": text} if field == "podCidr" else
                       {"podCidr": "", "podCidrv6": text} for field, text, _ in cases)
    wrong = [(field, text, "refused" if why else "rendered")
             for (field, text, takes), why in zip(cases, refused, strict=True)
             if bool(why) == takes or (why and f"at '/{field}'" not in why)]
    assert not wrong, wrong


@pytest.mark.parametrize(("values", "message"), [
    ({"podCidr": "", "podCidrv6": ""}, "podCidr and podCidrv6 are both empty"),
    ({"podCidr": None}, "podCidr and podCidrv6 are both empty"),
    ({"flannel": {"backend": "ipsec"}},
     "flannel.psk: the ipsec backend needs a PSK of 96 to 4096 characters"),
    ({"flannel": {"args": ["--ip-masq", "--kube-subnet-mgr", "--ip-mask"]}},
     r"flannel.args\[2\]: --ip-mask is not a flag of flanneld"),
    ({"flannel": {"args": ["-iface-regx=eth.*"]}},
     r"flannel.args\[0\]: -iface-regx=eth.\* is not a flag of flanneld"),
    ({"flannel": {"args": ["--healthz-port=9000"]}},
     r"flannel.args\[0\]: --healthz-port=9000: the chart sets --healthz-port from "
     "flannel.healthz.port"),
    ({"flannel": {"image_cni": {"repository": "mirror.example/flannel-cni-plugin"}}},
     "flannel.image_cni: Go flannel's chart calls it flannel.flannel_cni.image since v0.28.3"),
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


def test_the_args_check_knows_every_flag_of_flanneld():
    """The chart's list of flanneld's flags (templates/_helpers.tpl) is flanneld's own, and
    every one of them renders, in each way flanneld takes it."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    listed = re.search(r"\$known := list\s(.*?)\}\}", helpers, re.S)
    assert listed is not None
    assert set(re.findall(r'"([^"]+)"', listed[1])) == {f.name for f in FLAGS} | {"h", "help"}
    args = [form.format(f.name) for f in FLAGS if f.name != "healthz-port"
            for form in ("--{}", "-{}=x")]
    assert container(render({"flannel": {"args": args}}), "kube-flannel")["args"][:-1] == args


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def documented_commands() -> list[tuple[str, str]]:
    """(file, command): every `helm install|upgrade|template` of this chart in the docs, in
    code blocks (continuation lines joined) or inline."""
    found = []
    for path in [ROOT / "README.md", CHART / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for match in re.finditer(r"helm (?:install|upgrade|template) [^`\n]*(?:\n[^`\n]*)?",
                                 text):
            command = match[0]
            if text[match.start() - 1] != "`":  # in a code block: one (joined) line
                command = command.split("\n")[0]
            if " deploy/chart" in command:
                found.append((path.name, " ".join(command.split())))
    return found


def test_every_helm_command_in_the_docs_renders():
    """Each documented install or upgrade of this chart renders with the values it gives
    (`-f your-values.yaml`: a values file of Go flannel's chart; placeholders such as
    `<new tag>`: a word)."""
    commands = documented_commands()
    assert len(commands) >= 5, commands
    refused = []
    for where, command in commands:
        words = shlex.split(re.sub(r"<[^>]*>", "placeholder", command))
        values: dict[str, Any] = {}
        for option, argument in zip(words, [*words[1:], ""], strict=True):
            if option in ("-f", "--values"):
                values = merged(values, values_file("upstream-defaults"))
            elif option == "--set":
                values = merged(values, helm.parse_set_string(argument))
            elif option == "--set-string":
                values = merged(values, helm.parse_set_string_values(argument))
        refused += [f"{where}: {command}: {why}" for why in refusals([values]) if why]
    assert not refused, refused
