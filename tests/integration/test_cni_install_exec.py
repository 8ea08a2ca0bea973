"""The installed Python plugin run as kubelet runs it (exec of ``flannel`` with the CNI
environment and stdin) under the host's Python, pyenv's 3.9 and 3.13: pod ADD/DEL in network
namespaces with Debian's real ``bridge`` and ``host-local``, a bin dir moved after install,
the launcher's own error JSON, and pod calls during repeated upgrades."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import flannel
from flannel.cni.install import LIBRARY_DIR, launcher_library
from tests.support import netns
from tests.support.pythons import python_or_skip, without_json
from tests.support.waiting import wait_until

CNI_DIR = Path("/usr/lib/cni")
SUBNET_ENV = "FLANNEL_NETWORK=10.78.0.0/16\nFLANNEL_SUBNET=10.78.3.1/24\nFLANNEL_MTU=1450\n" \
             "FLANNEL_IPMASQ=true\n"
PYTHONS = ["host", "3.9.18", "3.13.0"]
needs_plugins = pytest.mark.skipif(not (CNI_DIR / "bridge").exists(),
                                   reason="needs Debian containernetworking-plugins")


def flannelctl(package_root: Path, *argv: str) -> subprocess.CompletedProcess:
    """``flannelctl`` of the pyflannel whose ``flannel`` package lies in ``package_root``
    (standard library only, like the image's install step)."""
    code = (f"import sys; sys.path.insert(0, {str(package_root)!r}); "
            f"from flannel.ctl import main; sys.exit(main({list(argv)!r}))")
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=60, check=False)


def install(bin_dir: Path, python: str, package_root: Path | None = None) -> Path:
    root = package_root or Path(flannel.__file__).resolve().parent.parent
    proc = flannelctl(root, "install-cni", "--bin-dir", str(bin_dir), "--conf-dir",
                      str(bin_dir.parent / "conf"), "--python", python)
    assert proc.returncode == 0, proc.stderr
    return bin_dir / "flannel"


def call(plugin: Path, command: str, stdin: bytes = b'{"cniVersion":"1.0.0"}',
         host_ns: str | None = None, **cni: str) -> tuple[int, bytes]:
    """Exec ``plugin`` as a runtime does; (exit status, stdout)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **cni}
    if command:
        env["CNI_COMMAND"] = command
    argv = ["ip", "netns", "exec", host_ns, str(plugin)] if host_ns else [str(plugin)]
    proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, timeout=60,
                          check=False)
    assert proc.stderr == b"", proc.stderr.decode()
    return proc.returncode, proc.stdout


def version_call(plugin: Path) -> dict:
    code, out = call(plugin, "VERSION")
    assert code == 0, out
    return json.loads(out)


def error_call(plugin: Path, *argv: str) -> dict:
    """The plugin started as ``argv + [plugin]`` (``[python, "-IS"]``: what the kernel runs
    for the launcher's #! line); its answer must be error JSON."""
    proc = subprocess.run([*argv, str(plugin)], input=b'{"cniVersion":"1.0.0"}',
                          env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=60,
                          check=False)
    assert proc.returncode == 1 and proc.stderr == b"", proc.stderr.decode()
    return json.loads(proc.stdout)


class Pods:
    """A node's network namespace and pods attached through the installed plugin."""

    def __init__(self, tmp_path: Path, host_ns: str, plugin: Path) -> None:
        self.tmp = tmp_path
        self.host_ns = host_ns
        self.plugin = plugin
        self.subnet_file = tmp_path / "subnet.env"
        self.subnet_file.write_text(SUBNET_ENV)
        self.namespaces: list[str] = []

    def netconf(self) -> bytes:
        return json.dumps({"cniVersion": "1.0.0", "name": "cbr0", "type": "flannel",
                           "subnetFile": str(self.subnet_file),
                           "dataDir": str(self.tmp / "flannel-data"),
                           "ipam": {"dataDir": str(self.tmp / "ipam")},
                           "delegate": {"isDefaultGateway": True}}).encode()

    def new_pod(self) -> str:
        name = netns.create("pod")
        self.namespaces.append(name)
        return name

    def cni(self, command: str, pod: str, container_id: str) -> tuple[int, bytes]:
        return call(self.plugin, command, self.netconf(), self.host_ns,
                    CNI_CONTAINERID=container_id, CNI_NETNS=f"/run/netns/{pod}",
                    CNI_IFNAME="eth0", CNI_PATH=f"{self.plugin.parent}:{CNI_DIR}")

    def add_and_delete(self, pod: str, container_id: str) -> str:
        code, out = self.cni("ADD", pod, container_id)
        assert code == 0, out
        address = json.loads(out)["ips"][0]["address"]
        assert address.startswith("10.78.3."), out
        code, out = self.cni("DEL", pod, container_id)
        assert (code, out) == (0, b""), out
        return address

    def close(self) -> None:
        for name in self.namespaces:
            netns.delete(name)


@pytest.fixture
def pods_for(ns, tmp_path):
    made: list[Pods] = []

    def make(plugin: Path) -> Pods:
        made.append(Pods(tmp_path, ns, plugin))
        return made[-1]

    yield make
    for pods in made:
        pods.close()


@needs_plugins
@pytest.mark.parametrize("version", PYTHONS)
def test_pod_add_and_del(tmp_path, pods_for, version):
    python = python_or_skip(version)
    plugin = install(tmp_path / "bin", python)
    assert plugin.read_text().startswith(f"#!{python} -IS\n")
    assert version_call(plugin)["supportedVersions"][-1] == "1.1.0"
    pods = pods_for(plugin)
    pod = pods.new_pod()
    pods.add_and_delete(pod, "pod-a")
    assert not (tmp_path / "flannel-data" / "pod-a").exists()


@pytest.mark.parametrize("version", PYTHONS)
def test_bin_dir_moved_copied_or_linked_after_install(tmp_path, version):
    """The host path differs from the install path (k3s, GKE, a custom cniBinDir)."""
    python = python_or_skip(version)
    install(tmp_path / "init-container-mount", python)
    moved = tmp_path / "host" / "opt-cni-bin"
    moved.parent.mkdir()
    (tmp_path / "init-container-mount").rename(moved)
    assert "supportedVersions" in version_call(moved / "flannel")
    copied = tmp_path / "copy"
    shutil.copytree(moved, copied, symlinks=True)
    shutil.rmtree(moved)
    assert "supportedVersions" in version_call(copied / "flannel")
    linked = tmp_path / "elsewhere" / "flannel"
    linked.parent.mkdir()
    linked.symlink_to(copied / "flannel")
    assert "supportedVersions" in version_call(linked)


@pytest.mark.parametrize("version", ["host", "3.9.18", "3.13.0"])
def test_launcher_answers_error_json(tmp_path, version):
    """Run the launcher the way its #! line makes the kernel run it, under each Python."""
    python = python_or_skip(version)
    plugin = install(tmp_path / "bin", python_or_skip("host"))
    library = tmp_path / "bin" / LIBRARY_DIR / launcher_library(plugin)
    run = [python, "-IS"]
    version_text = subprocess.run([python, "-c", "import platform; "
                                   "print(platform.python_version())"], capture_output=True,
                                  text=True, timeout=30, check=True).stdout.strip()

    (library / "flannel" / "cni" / "lite.py").unlink()
    answer = error_call(plugin, *run)
    assert answer.keys() == {"cniVersion", "code", "msg"}
    assert (answer["cniVersion"], answer["code"]) == ("1.1.0", 999)
    # ImportError or ModuleNotFoundError, depending on how plugin.py imports lite.
    assert answer["msg"].startswith(f"flannel CNI plugin library at {library} failed to load "
                                    f"with {python} (Python {version_text}): ")
    assert "Error: " in answer["msg"] and "lite" in answer["msg"]
    assert answer["msg"].endswith("; re-run flannelctl install-cni")

    shutil.rmtree(tmp_path / "bin" / LIBRARY_DIR)
    missing = {"cniVersion": "1.1.0", "code": 999,
               "msg": f"flannel CNI plugin library missing at {library}; re-run flannelctl "
                      "install-cni"}
    assert error_call(plugin, *run) == missing
    code, out = call(plugin, "ADD")  # exec'ed as a runtime does: its #! line's Python
    assert (code, json.loads(out)) == (1, missing)


def test_launcher_under_a_python_too_old_or_without_json(tmp_path):
    plugin = install(tmp_path / "bin", python_or_skip("host"))
    library = tmp_path / "bin" / LIBRARY_DIR / launcher_library(plugin)
    old = python_or_skip("3.6.15")
    assert error_call(plugin, old, "-IS")["msg"] == (
        f"the flannel CNI plugin needs Python 3.9 or later, {old} (Python 3.6.15) is too old: "
        "install a newer Python and re-run flannelctl install-cni --python PATH")
    minimal = without_json(python_or_skip("host"), tmp_path / "python-minimal", package=True)
    message = error_call(plugin, minimal, "-IS")["msg"]
    assert message.startswith(f"flannel CNI plugin library at {library} failed to load with "
                              f"{minimal} (Python ")
    assert message.endswith("ModuleNotFoundError: No module named 'json'; re-run flannelctl "
                            "install-cni")


def test_launcher_under_a_python_without_the_private_json_module(tmp_path):
    plugin = install(tmp_path / "bin", python_or_skip("host"))
    python = without_json(python_or_skip("host"), tmp_path / "python-no-_json")
    proc = subprocess.run([python, "-IS", str(plugin)], input=b'{"cniVersion":"1.0.0"}',
                          env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["supportedVersions"][-1] == "1.1.0"


def upgraded_copy(directory: Path) -> Path:
    """A pyflannel tree whose plugin modules differ from this one's in three places a call
    can see: the version (about text), plugin.about() and lite.dumps() (a trailing space)."""
    package = directory / "flannel"
    shutil.copytree(Path(flannel.__file__).resolve().parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (package / "version.py").write_text('__version__ = "0.1.0+upgrade"\n')
    plugin, lite = package / "cni" / "plugin.py", package / "cni" / "lite.py"
    assert "\ndef about(" in plugin.read_text() and "\ndef dumps(" in lite.read_text()
    with plugin.open("a") as handle:
        handle.write("\n\n_about = about\n\n\ndef about():\n    return _about() + ' [upgrade]'\n")
    with lite.open("a") as handle:
        handle.write("\n\n_dumps = dumps\n\n\ndef dumps(value):\n    return _dumps(value) + ' '\n")
    return directory


def observed_version(plugin: Path) -> str:
    """Which install answered one call; AssertionError when that call saw modules of both."""
    code, out = call(plugin, "VERSION")
    assert code == 0 and "supportedVersions" in json.loads(out), out
    code, about = call(plugin, "")  # no CNI_COMMAND: the answer names the plugin's version
    msg = json.loads(about)["msg"]
    marks = ("version 0.1.0+upgrade " in msg,
             msg.endswith("pyflannel [upgrade]), run by a container runtime"),
             about.endswith(b" \n"))
    assert all(marks) or not any(marks), about
    return "upgrade" if marks[0] else "base"


@needs_plugins
def test_pod_calls_during_repeated_upgrades(tmp_path, pods_for):
    """Installs alternate between two versions while a pod's calls run back to back: every
    call succeeds and sees one version whole; at most the previous library stays."""
    python = python_or_skip("host")
    base_root = Path(flannel.__file__).resolve().parent.parent
    upgrade_root = upgraded_copy(tmp_path / "upgrade-src")
    bin_dir = tmp_path / "bin"
    plugin = install(bin_dir, python)
    pods = pods_for(plugin)
    pod = pods.new_pod()
    calls: list[tuple[float, str]] = []
    failures: list[str] = []
    stop = threading.Event()

    def pod_calls() -> None:
        number = 0
        while not stop.is_set():
            number += 1
            started = time.monotonic()
            try:
                seen = observed_version(plugin)
                pods.add_and_delete(pod, f"upgrade-{number}")
            except Exception as err:  # reported by the test thread
                failures.append(f"call {number}: {err!r}")
                return
            calls.append((started, seen))

    worker = threading.Thread(target=pod_calls)
    worker.start()
    try:
        for round_number in range(6):
            root, expected = ((upgrade_root, "upgrade") if round_number % 2 == 0
                              else (base_root, "base"))
            previous = launcher_library(plugin)
            install(bin_dir, python, root)
            installed = time.monotonic()
            # The next install only once a whole call has started after this one: a call in
            # flight may still need the previous library, never the one before it.
            wait_until(lambda t=installed, e=expected: failures or any(
                start > t and seen == e for start, seen in calls), timeout=60,
                what=f"a pod call seeing the {expected} install")
            assert not failures, failures
            names = sorted(p.name for p in (bin_dir / LIBRARY_DIR).iterdir())
            assert names == sorted([previous, launcher_library(plugin)])
    finally:
        stop.set()
        worker.join(timeout=120)
    assert not failures, failures
    assert {seen for _, seen in calls} == {"base", "upgrade"}
    assert not os.listdir(tmp_path / "flannel-data")
