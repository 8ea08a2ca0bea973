"""The installed ``flannel`` CNI executable, invoked the way a runtime does (environment +
stdin, in a network namespace), delegating to Debian's real ``bridge`` and ``host-local``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from flannel.cni.install import install_plugin
from tests.support import netns
from tests.support.cniexec import write_delegate

CNI_DIR = Path("/usr/lib/cni")
ENV_V4 = "FLANNEL_NETWORK=10.77.0.0/16\nFLANNEL_SUBNET=10.77.5.1/24\nFLANNEL_MTU=1450\n" \
         "FLANNEL_IPMASQ=true\n"
ENV_V6 = "FLANNEL_IPV6_NETWORK=fd00:77::/56\nFLANNEL_IPV6_SUBNET=fd00:77:0:5::1/64\n"

pytestmark = pytest.mark.skipif(not (CNI_DIR / "bridge").exists(),
                                reason="needs Debian containernetworking-plugins")


class Runtime:
    """Plays the container runtime: one host namespace, pod namespaces, one plugin dir."""

    def __init__(self, tmp_path: Path, host_ns: str) -> None:
        self.tmp = tmp_path
        self.host_ns = host_ns
        self.bin_dir = tmp_path / "bin"
        self.plugin = install_plugin(self.bin_dir)
        self.subnet_file = tmp_path / "subnet.env"
        self.data_dir = tmp_path / "flannel-data"
        self.ipam_dir = tmp_path / "ipam"
        self.pods: list[str] = []
        self.stderr = ""

    def netconf(self, **extra: object) -> dict:
        return {"cniVersion": "1.0.0", "name": "cbr0", "type": "flannel",
                "subnetFile": str(self.subnet_file), "dataDir": str(self.data_dir),
                "ipam": {"dataDir": str(self.ipam_dir)},
                "delegate": {"isDefaultGateway": True}, **extra}

    def pod(self) -> str:
        name = netns.create("pod")
        self.pods.append(name)
        return name

    def call(self, command: str, pod: str, container_id: str, conf: dict | None = None,
             cni_path: str | None = None) -> tuple[int, dict | None]:
        env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": command,
               "CNI_CONTAINERID": container_id, "CNI_NETNS": f"/run/netns/{pod}",
               "CNI_IFNAME": "eth0", "CNI_PATH": cni_path or f"{self.bin_dir}:{CNI_DIR}"}
        proc = subprocess.run(["ip", "netns", "exec", self.host_ns, str(self.plugin)],
                              input=json.dumps(conf or self.netconf()).encode(), env=env,
                              capture_output=True, timeout=60, check=False)
        self.stderr = proc.stderr.decode(errors="replace")
        out = proc.stdout.decode().strip()
        return proc.returncode, json.loads(out) if out else None

    def reservations(self) -> list[str]:
        net_dir = self.ipam_dir / "cbr0"
        if not net_dir.exists():
            return []
        return sorted(p.name for p in net_dir.iterdir()
                      if p.name[0].isdigit() or ":" in p.name)


@pytest.fixture
def runtime(ns, tmp_path):
    rt = Runtime(tmp_path, ns)
    try:
        yield rt
    finally:
        for pod in rt.pods:
            netns.delete(pod)


def addresses(pod: str) -> list[str]:
    links = json.loads(netns.ip("-j", "addr", "show", "eth0", netns=pod, check=False).stdout
                       or "[]")
    return [f"{a['local']}/{a['prefixlen']}" for link in links for a in link["addr_info"]
            if a.get("scope") == "global"]


def test_add_check_del_with_bridge_and_host_local(runtime):
    runtime.subnet_file.write_text(ENV_V4)
    pod = runtime.pod()
    code, result = runtime.call("ADD", pod, "pod1")
    assert code == 0, result
    ip = result["ips"][0]["address"]
    assert ip.startswith("10.77.5.") and ip.endswith("/24")
    assert addresses(pod) == [ip]
    routes = netns.ip("route", netns=pod).stdout
    assert "10.77.0.0/16 via 10.77.5.1" in routes and "default via 10.77.5.1" in routes
    links = json.loads(netns.ip("-j", "link", "show", "eth0", netns=pod).stdout)
    assert links[0]["mtu"] == 1450
    saved = runtime.data_dir / "pod1"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(runtime.data_dir.stat().st_mode) == 0o700
    assert json.loads(saved.read_text())["ipam"]["ranges"] == [[{"subnet": "10.77.5.0/24"}]]
    assert runtime.reservations() == [ip.split("/")[0]]

    assert runtime.call("CHECK", pod, "pod1") == (0, None)

    # DEL must use the saved config, even if subnet.env is gone.
    runtime.subnet_file.unlink()
    assert runtime.call("DEL", pod, "pod1") == (0, None)
    assert addresses(pod) == []
    assert runtime.reservations() == []
    assert not saved.exists()
    assert runtime.call("DEL", pod, "pod1") == (0, None)  # a second DEL succeeds


def test_dual_stack_add(runtime):
    runtime.subnet_file.write_text(ENV_V4 + ENV_V6)
    pod = runtime.pod()
    code, result = runtime.call("ADD", pod, "pod-dual")
    assert code == 0, result
    families = sorted(":" in entry["address"] for entry in result["ips"])
    assert families == [False, True]
    assert any(a.startswith("fd00:77:0:5::") for a in addresses(pod))
    assert "fd00:77::/56 via fd00:77:0:5::1" in netns.ip("-6", "route", netns=pod).stdout
    assert runtime.call("DEL", pod, "pod-dual") == (0, None)
    assert runtime.reservations() == []


def test_errors_are_cni_error_json(runtime):
    pod = runtime.pod()
    code, error = runtime.call("ADD", pod, "pod-x")
    assert code == 1
    assert error["code"] == 11 and "Is flanneld running on this node?" in error["msg"]
    assert error["cniVersion"] == "1.0.0"

    runtime.subnet_file.write_text(ENV_V4)
    code, error = runtime.call("ADD", pod, "pod-x", cni_path=str(runtime.bin_dir))
    assert code == 1 and 'failed to find plugin "bridge"' in error["msg"]

    code, error = runtime.call("ADD", pod, "../../etc/passwd")
    assert code == 1 and error["code"] == 4 and "not a safe file name" in error["msg"]
    assert not (runtime.tmp / "etc").exists()

    code, error = runtime.call("ADD", pod, "pod-x", conf={**runtime.netconf(),
                                                        "delegate": {"name": "x"}})
    assert code == 1 and "must not have 'name' field" in error["msg"]


def test_version_command(runtime):
    env = {"CNI_COMMAND": "VERSION"}
    proc = subprocess.run([str(runtime.plugin)], input=b'{"cniVersion":"1.1.0"}', env=env,
                          capture_output=True, timeout=30, check=True)
    assert json.loads(proc.stdout)["supportedVersions"][-1] == "1.1.0"


# ---- DEL converges (a saved config the delegate will always refuse) ------------------------

def _rewrite_saved(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("changes", [{"mtu": "abc"}, {"type": 7}, {"cniVersion": "1.1.0"}])
def test_del_of_a_config_refused_for_good_frees_the_address_and_succeeds(runtime, changes):
    runtime.subnet_file.write_text(ENV_V4)
    pod = runtime.pod()
    code, result = runtime.call("ADD", pod, "pod-bad")
    assert code == 0, result
    assert len(runtime.reservations()) == 1
    saved = runtime.data_dir / "pod-bad"
    _rewrite_saved(saved, **changes)
    assert runtime.call("DEL", pod, "pod-bad") == (0, None)
    assert not saved.exists()
    assert f"DEL pod-bad: the saved config {saved}" in runtime.stderr
    assert "removed the saved config" in runtime.stderr
    if "cniVersion" in changes:  # host-local refuses 1.1.0 as well: said, and left
        assert "failed too (code 1: incompatible CNI versions): free it by hand" \
            in runtime.stderr
    else:
        assert "its address was released through host-local" in runtime.stderr
        assert runtime.reservations() == []
    assert runtime.call("DEL", pod, "pod-bad") == (0, None)


def test_del_keeps_the_saved_config_when_the_delegate_fails_transiently(runtime):
    runtime.subnet_file.write_text(ENV_V4)
    pod = runtime.pod()
    assert runtime.call("ADD", pod, "pod-busy")[0] == 0
    busy = runtime.tmp / "busy"
    write_delegate(busy, "bridge", 'cat >/dev/null; echo \'{"code":11,"msg":"busy"}\'; exit 1\n')
    code, error = runtime.call("DEL", pod, "pod-busy", cni_path=f"{busy}:{CNI_DIR}")
    assert (code, error["code"], error["msg"]) == (1, 11, "busy")
    assert (runtime.data_dir / "pod-busy").exists() and len(runtime.reservations()) == 1
    assert runtime.call("DEL", pod, "pod-busy") == (0, None)  # the retry cleans up
    assert runtime.reservations() == [] and not (runtime.data_dir / "pod-busy").exists()


def test_del_of_a_config_saved_with_a_float_mtu_succeeds_normally(runtime):
    runtime.subnet_file.write_text(ENV_V4)
    pod = runtime.pod()
    assert runtime.call("ADD", pod, "pod-float")[0] == 0
    saved = runtime.data_dir / "pod-float"
    saved.write_text(saved.read_text().replace('"mtu":1450', '"mtu":1450.0'))
    assert runtime.call("DEL", pod, "pod-float") == (0, None)
    assert runtime.stderr == "" and runtime.reservations() == []


# ---- golden: the saved delegate config equals upstream's (compat reference section 10) ----

V4_GOLDEN = ('{{{version}"ipMasq":{masq},"ipam":{{"dataDir":"{ipam}","ranges":'
             '[[{{"subnet":"10.77.5.0/24"}}]{v6range}],"routes":[{{"dst":"10.77.0.0/16"}}'
             '{v6route}],"type":"host-local"}},{mid}"isGateway":true,"mtu":{mtu},"name":"cbr0",'
             '{extra}"type":"bridge"}}')


def golden(runtime: Runtime, version: str | None = "1.0.0", masq: str = "false",
           dual: bool = False, mtu: int = 1450, extra: str = "", front: str = "",
           mid: str = "") -> str:
    return V4_GOLDEN.format(
        version=(f'"cniVersion":"{version}",' if version else "") + front, masq=masq,
        ipam=runtime.ipam_dir, mtu=mtu, extra=extra, mid=mid,
        v6range=',[{"subnet":"fd00:77:0:5::/64"}]' if dual else "",
        v6route=',{"dst":"fd00:77::/56"}' if dual else "")


GOLDEN_CASES = {
    "ipv4": ({}, ENV_V4, {}),
    "ipmasq false": ({}, ENV_V4.replace("=true", "=false"), {"masq": "true"}),
    "dual-stack": ({}, ENV_V4 + ENV_V6, {"dual": True}),
    "no cniVersion": ({"cniVersion": None}, ENV_V4, {"version": None}),
    "custom delegate fields": (
        {"delegate": {"hairpinMode": True, "isDefaultGateway": True, "ipMasq": True,
                      "mtu": 1400.0}}, ENV_V4,
        {"masq": "true", "mtu": 1400, "front": '"hairpinMode":true,',
         "mid": '"isDefaultGateway":true,'}),
    "portMappings": (
        {"runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80,
                                             "protocol": "tcp"}]}}, ENV_V4,
        {"extra": '"runtimeConfig":{"portMappings":[{"containerPort":80,"hostPort":8080,'
                  '"protocol":"tcp"}]},'}),
    **{f"cniVersion {v}": ({"cniVersion": v}, ENV_V4, {"version": v})
       for v in ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")},
}


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_saved_delegate_config_is_upstreams(runtime, case):
    overrides, env_text, expect = GOLDEN_CASES[case]
    runtime.subnet_file.write_text(env_text)
    runtime.data_dir = runtime.tmp / "custom" / "data"  # a nested, custom dataDir
    conf = {k: v for k, v in {**runtime.netconf(delegate={}), **overrides}.items()
            if v is not None}
    pod = runtime.pod()
    code, result = runtime.call("ADD", pod, "pod-g", conf=conf)
    saved = runtime.data_dir / "pod-g"
    assert saved.read_text() == golden(runtime, **expect)
    if overrides.get("cniVersion") == "1.1.0":  # Debian's bridge stops at 1.0.0
        assert (code, result["code"]) == (1, 1)
    else:
        assert code == 0, result
    assert runtime.call("DEL", pod, "pod-g", conf=conf) == (0, None)
    assert not saved.exists()
