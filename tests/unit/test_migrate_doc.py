"""docs/migrate.md, run as far as it runs here: every file it names is in the repository, the
kustomizations it names and shows render with kubectl (the upstream-selector overlay with
upstream's selector), every pyflannel command line in it parses with our tools,
``mk-docker-opts`` run as its systemd drop-in runs it writes the Docker options, the
settings file and ExecStart lines it shows are accepted by flanneld, the flags it says Go
flanneld lacks are exactly ours beyond Go's, and the backend it calls unsupported is not ours.
What needs a cluster, Helm or systemd (kubectl apply, helm upgrade, systemctl) is not run:
tests/lab/test_rolling_update.py measures the node-by-node handover itself."""

from __future__ import annotations

import re
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from flannel import backend, ctl
from flannel.flags import FLAGS, parse_namespace
from flannel.optbin import dockeropts
from tests.deploy.manifests import KUSTOMIZE, documents, pod_spec

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "migrate.md"
TEXT = DOC.read_text()
#: Go flannel v0.28.9's selector once its kustomization's commonLabels are applied.
UPSTREAM_KUSTOMIZE_SELECTOR = {"app": "flannel", "k8s-app": "flannel"}
IMAGE = "registry.example.com/net/pyflannel:v0.1.0"
#: Go flanneld v0.28.9's flags (its own and klog's), from its flag set.
GO_FLAGS = {
    "etcd-endpoints", "etcd-prefix", "etcd-keyfile", "etcd-certfile", "etcd-cafile",
    "etcd-username", "etcd-password", "iface", "iface-regex", "iface-can-reach", "subnet-file",
    "public-ip", "public-ipv6", "subnet-lease-renew-margin", "ip-masq",
    "ip-masq-fully-random-disable", "kube-subnet-mgr", "kube-api-url", "kube-annotation-prefix",
    "kubeconfig-file", "version", "healthz-ip", "healthz-port", "iptables-resync",
    "iptables-forward-rules", "ip-blackhole-route", "net-config-path",
    "set-node-network-unavailable", "v", "vmodule", "log_backtrace_at"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", TEXT, re.S)


def shell_commands() -> list[list[str]]:
    """Every command of the doc's sh blocks as words (continuations joined, comments cut,
    split again at ``&&``, ``;``, ``|``)."""
    commands = []
    for block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for word in [*words, ";"]:
                if word in ("&&", ";", "|", "||"):
                    if current:
                        commands.append(current)
                    current = []
                else:
                    current.append(word)
    return commands


def invocations(program: str) -> list[list[str]]:
    """The arguments of every call of ``program`` (by its last path part) in the sh blocks."""
    found = []
    for words in shell_commands():
        for i, word in enumerate(words):
            if word.rsplit("/", 1)[-1] == program:
                found.append(words[i + 1:])
                break
    return found


def test_the_readme_links_the_guide():
    assert "(docs/migrate.md)" in (ROOT / "README.md").read_text()


def test_every_link_within_the_guide_leads_to_a_heading():
    def slug(heading: str) -> str:  # as GitHub makes anchors
        return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")

    anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", TEXT, re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", TEXT))
    assert links and links <= anchors, links - anchors


def repo_paths() -> list[str]:
    return sorted(set(re.findall(r"(?<![\w./-])((?:deploy|docs|tests)/[\w.-]+(?:/[\w.-]+)*)",
                                 TEXT)))


@pytest.mark.parametrize("path", repo_paths())
def test_every_file_it_names_exists(path):
    assert (ROOT / path).exists(), f"docs/migrate.md names {path}, which is not in the tree"


def overlays() -> list[str]:
    return sorted(set(re.findall(r"deploy/kustomize/overlays/([\w-]+)", TEXT)))


@pytest.mark.parametrize("name", overlays())
def test_every_overlay_it_names_renders(name):
    daemonset = documents(KUSTOMIZE / "overlays" / name)["DaemonSet/kube-flannel-ds"]
    assert daemonset["metadata"]["namespace"] == "kube-flannel"


def test_upstream_selector_overlay_keeps_upstreams_selector():
    daemonset = documents(KUSTOMIZE / "overlays" / "upstream-selector")[
        "DaemonSet/kube-flannel-ds"]
    assert daemonset["spec"]["selector"]["matchLabels"] == UPSTREAM_KUSTOMIZE_SELECTOR
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert UPSTREAM_KUSTOMIZE_SELECTOR.items() <= labels.items()


def test_the_example_overlay_renders_with_the_image_swapped(tmp_path):
    example = next(b for b in blocks("yaml") if "my-flannel/kustomization.yaml" in b)
    own = tmp_path / "my-flannel"
    own.mkdir()
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")  # kustomize takes no absolute bases
    (own / "kustomization.yaml").write_text(textwrap.dedent(example))
    spec = pod_spec(documents(own))
    images = {c["name"]: c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images["kube-flannel"] == images["install-cni"] == IMAGE


def test_the_canary_patch_holds_the_rollout(tmp_path):
    patch = yaml.safe_load(textwrap.dedent(next(b for b in blocks("yaml") if "OnDelete" in b)))
    own = tmp_path / "my-flannel"
    own.mkdir()
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    (own / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": ["../deploy/kustomize/base"], **patch}))
    daemonset = documents(own)["DaemonSet/kube-flannel-ds"]
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_set_image_names_the_containers_of_the_daemonset():
    """`kubectl set image` by container name: the doc's names are the DaemonSet's."""
    spec = pod_spec(documents(KUSTOMIZE / "base"))
    names = {c["name"] for c in spec["containers"] + spec["initContainers"]}
    for args in invocations("kubectl"):
        if args[:1] == ["-n"] and "set" in args and "image" in args:
            assignments = [a.split("=", 1)[0] for a in args if "=" in a and ":" in a]
            assert assignments and set(assignments) <= names, args


def test_flannelctl_command_lines_parse():
    calls = invocations("flannelctl")
    assert {c[0] for c in calls} >= {"status", "doctor", "check"}
    parser = ctl.build_parser()
    for args in calls:
        parsed = parser.parse_args(args)
        assert callable(parsed.func), args


def test_mk_docker_opts_as_the_drop_in_runs_it(tmp_path):
    dropin = next(b for b in blocks("ini") if "ExecStartPost=" in b)
    command = shlex.split(re.search(r"ExecStartPost=(.*)", dropin).group(1))
    prefix = re.search(r'^prefix=(\S+)$', (ROOT / "deploy/install-host.sh").read_text(), re.M)
    assert command[0] == f"{prefix.group(1)}/bin/mk-docker-opts"
    assert ('mk-docker-opts = "flannel.optbin.dockeropts:main"'
            in (ROOT / "pyproject.toml").read_text())
    subnet_env = tmp_path / "subnet.env"
    subnet_env.write_text("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.72.1/24\n"
                          "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n")
    args = command[1:]
    args[args.index("-d") + 1] = str(tmp_path / "docker")
    assert dockeropts.main(["-f", str(subnet_env), *args]) == 0
    assert ('DOCKER_NETWORK_OPTIONS=" --bip=10.5.72.1/24 --ip-masq=false --mtu=1450"'
            in (tmp_path / "docker").read_text())


def test_flanneld_command_lines_parse():
    """The drop-ins' ExecStart lines: flanneld accepts every flag (the store is not asked)."""
    lines = [re.search(r"ExecStart=(\S*flanneld .*)", b) for b in blocks("ini")]
    commands = [shlex.split(m.group(1)) for m in lines if m]
    assert commands
    for command in commands:
        assert command[0] == "/opt/pyflannel/bin/flanneld"
        parse_namespace(command[1:], {})


def test_the_settings_file_is_accepted_by_flanneld():
    block = next(b for b in blocks("sh") if "FLANNELD_ETCD_ENDPOINTS=" in b)
    environ = dict(line.strip().split("=", 1) for line in block.splitlines() if line.strip())
    known = {flag.env_name for flag in FLAGS}
    assert set(environ) <= known
    args = parse_namespace([], environ)
    assert args.ip_masq is True and args.healthz_port == 8081 and args.iface == ["eth1"]


def test_every_flanneld_variable_and_flag_it_names_exists():
    known = {flag.env_name for flag in FLAGS}
    assert set(re.findall(r"FLANNELD_[A-Z_]+[A-Z]", TEXT)) - {"FLANNELD_FLAG"} <= known
    names = {flag.name for flag in FLAGS}
    for flag in re.findall(r"`-{1,2}([a-z][a-z-]+)", TEXT.split("## What carries over")[1]
                           .split("## A:")[0]):
        assert flag in names, flag


def test_before_a_rollback_it_names_every_flag_go_flannel_lacks():
    """Go flanneld stops on a flag it does not know: the guide must name each of ours."""
    sentence = re.search(r"take out\s+what only pyflannel understands: the flags (.*?) \(",
                         TEXT, re.S).group(1)
    flags = set(re.findall(r"`--([a-z-]+)`", sentence))
    assert flags == {flag.name for flag in FLAGS} - GO_FLAGS


def test_install_host_options_it_uses_exist():
    usage = subprocess.run(["bash", str(ROOT / "deploy/install-host.sh"), "--help"],
                           capture_output=True, text=True, timeout=30, check=False).stderr
    for args in invocations("install-host.sh"):
        for option in (a for a in args if a.startswith("--")):
            assert option in usage, option


def test_the_unit_hands_over_as_the_guide_says():
    unit = (ROOT / "deploy/flanneld.service").read_text()
    # `systemctl restart` returns once pyflannel is ready; only flanneld gets the signal.
    assert "Type=notify" in unit and "KillMode=process" in unit
    assert "EnvironmentFile=/etc/default/flanneld" in unit


def test_what_it_calls_unsupported_is_not_a_backend():
    row = next(line for line in (ROOT / "docs/migrate.md").read_text().splitlines()
               if "[not supported]" in line)
    assert not [name for name in backend.supported() if f"`{name}`" in row], row


def test_yaml_blocks_are_yaml():
    for block in blocks("yaml"):
        yaml.safe_load(block)
