"""Each store's client is loaded only in its own mode: kube mode never loads the etcd client,
etcd mode never loads flanneld's Kubernetes API client (flannel.clients.kube.client and its
config and credential modules), ``flanneld --version`` loads neither.

And in real processes (CPython's verbose mode, ``-v`` set by PYTHONVERBOSE, names on stderr
every module a process loads, with no hook in flanneld): a started flanneld, in
either mode, imports no backend but its configured one, no cloud SDK, not the other store's
client and not prometheus_client until /metrics is first scraped; ``flanneld --version`` and
``flannelctl status`` import none of these.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from flannel import backend
from flannel_lab.etcd import EtcdServer
from tests.support import netns
from tests.support.checkout import FLANNELCTL, FLANNELD
from tests.support.flanneld import Flanneld
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
ETCD_CLIENT = ("flannel.clients.etcd", "flannel.subnet.etcd.manager")
KUBE_CLIENT = ("flannel.clients.kube.client", "flannel.clients.kube.config",
               "flannel.clients.kube.auth", "flannel.subnet.kube.manager")
CLOUD_SDKS = ("boto3", "botocore", "tencentcloud", "google.auth")
METRICS = ("prometheus_client", "flannel.monitor.metrics")
# What a started flanneld does without (each ~0.2 to 1 MiB of its memory for life, see
# docs/benchmarks.md "Idle flanneld at 25 MiB"): argparse (only for --help) and what it
# loads, shutil with bz2 and lzma, random, hashlib's OpenSSL digests; the status schema is
# loaded at the first /status.
IDLE_UNNEEDED = ("argparse", "gettext", "shutil", "bz2", "lzma", "random", "hashlib",
                 "_hashlib")
STATUS_SCHEMA = ("flannel.monitor.statusdoc",)
# Each backend type's modules: its own, and the packages only it uses.
BACKEND_MODULES = {
    "ali-vpc": ("flannel.backend.alivpc", "flannel.backend.cloudroutes", "flannel.cloud"),
    "alloc": ("flannel.backend.alloc",),
    "aws-vpc": ("flannel.backend.awsvpc", "flannel.backend.cloudroutes", "flannel.cloud"),
    "extension": ("flannel.backend.extension", "flannel.extension"),
    "gce": ("flannel.backend.gce", "flannel.backend.cloudroutes", "flannel.cloud"),
    "host-gw": ("flannel.backend.hostgw",),
    "ipip": ("flannel.backend.ipip",),
    "ipsec": ("flannel.backend.ipsec", "flannel.ipsec", "vici"),
    "tencent-vpc": ("flannel.backend.tencentvpc", "flannel.backend.cloudroutes",
                    "flannel.cloud"),
    "udp": ("flannel.backend.udp", "flannel.udp"),
    "vxlan": ("flannel.backend.vxlan",),
    "wireguard": ("flannel.backend.wireguard", "flannel.wireguard"),
}
# CPython's -v, for a process started with this environment. Not -X importtime: it leaves out
# what importlib.import_module loads, which is how backends and the metrics are loaded.
IMPORT_TRACE = {"PYTHONVERBOSE": "1"}
LOADED = re.compile(r"^import '([^']+)' # ", re.MULTILINE)

PROBE = """
import sys
from flannel import cli
mode = sys.argv[1]
if mode == "version":
    cli.main(["--version"])
else:
    from flannel import daemon, flags, subnet
    argv = (["--kube-subnet-mgr", "--kube-api-url=http://127.0.0.1:1"] if mode == "kube"
            else ["--etcd-endpoints=http://127.0.0.1:1"])
    manager = subnet.open_store(flags.parse_args(argv, {}).store)
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


def imported(stderr: str) -> set[str]:
    """Every module a process loaded, from its -v lines."""
    return set(LOADED.findall(stderr))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules that are one of ``names`` or inside one of them."""
    return sorted(m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names))


def other_backends(configured: str) -> tuple[str, ...]:
    own = BACKEND_MODULES[configured]
    return tuple(module for kind, modules in BACKEND_MODULES.items() if kind != configured
                 for module in modules if module not in own)


def test_every_backend_type_is_listed():
    assert sorted(BACKEND_MODULES) == backend.supported()


def test_version_imports_no_store_client_backend_sdk_or_metrics():
    result = subprocess.run([*FLANNELD, "--version"], capture_output=True, text=True,
                            timeout=60, check=True, env={**os.environ, **IMPORT_TRACE})
    modules = imported(result.stderr)
    assert "flannel.cli" in modules  # the probe sees flanneld's own imports
    everything = (*ETCD_CLIENT, *KUBE_CLIENT, *CLOUD_SDKS, *METRICS,
                  *(m for modules in BACKEND_MODULES.values() for m in modules))
    assert loaded(modules, everything) == []


def test_a_running_etcd_mode_flanneld_loads_its_backend_only_and_metrics_on_first_scrape(
        ns, tmp_path):
    """vxlan against a real etcd, with --ip-masq and the health server: up to ready, nothing
    but vxlan's backend and the etcd client, none of IDLE_UNNEEDED and not the status
    schema; ``flannelctl status`` asked meanwhile loads no store client, backend, SDK nor
    metrics (and the daemon then loads the status schema); the first /metrics scrape loads
    prometheus_client (which shows that the probe sees a late import)."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    env_file = tmp_path / "subnet.env"
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        server.ctl("put", "/coreos.com/network/config",
                   json.dumps({"Network": "10.5.0.0/16", "Backend": {"Type": "vxlan"}}))
        daemon = Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}",
                                     f"--subnet-file={env_file}", "--ip-masq",
                                     "--healthz-ip=127.0.0.1", "--healthz-port=18081"],
                          netns=ns, env=IMPORT_TRACE)
        try:
            daemon.start()
            wait_until(lambda: http_get(ns, "http://127.0.0.1:18081/readyz")[0] == 200, 30,
                       what=f"flanneld ready:\n{daemon.log}")
            assert loaded(imported(daemon.log), (*IDLE_UNNEEDED, *STATUS_SCHEMA)) == []
            status = subprocess.run(
                ["ip", "netns", "exec", ns, *FLANNELCTL,
                 "status", f"--subnet-file={env_file}"], capture_output=True, text=True,
                timeout=60, env={**os.environ, **IMPORT_TRACE})
            assert status.returncode == 0, status.stderr[-3000:]
            ctl = imported(status.stderr)
            assert "flannel.ops.status" in ctl
            assert loaded(ctl, (*ETCD_CLIENT, *KUBE_CLIENT, *CLOUD_SDKS, *METRICS,
                                *other_backends("vxlan"), "flannel.backend.vxlan")) == []
            started = imported(daemon.log)
            assert {"flannel.backend.vxlan", "flannel.clients.etcd", *STATUS_SCHEMA} <= started
            assert loaded(started, (*KUBE_CLIENT, *CLOUD_SDKS, *METRICS,
                                    *other_backends("vxlan"))) == []
            assert http_get(ns, "http://127.0.0.1:18081/metrics")[0] == 200
            assert "prometheus_client" in imported(daemon.log)
        finally:
            daemon.stop()


def test_a_running_kube_mode_flanneld_loads_no_etcd_client(ns, tmp_path, monkeypatch):
    """The whole kube-mode daemon (watch, lease, rules) runs without the etcd client, and it
    imports no backend but alloc, no cloud SDK and no metrics."""
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
                                 "--iptables-forward-rules=false"], netns=ns, env=IMPORT_TRACE)
    try:
        assert api.stdout.readline().startswith("listening")
        daemon.start()
        wait_until(env_file.exists, 20, what=f"subnet.env in kube mode:\n{daemon.log}")
        started = imported(daemon.log)
        assert {"flannel.backend.alloc", "flannel.clients.kube.client"} <= started
        assert loaded(started, (*ETCD_CLIENT, *CLOUD_SDKS, *METRICS,
                                *other_backends("alloc"))) == []
    finally:
        daemon.stop()
        api.terminate()
        api.wait(timeout=10)
