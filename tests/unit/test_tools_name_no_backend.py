"""The operator tools judge and clean a node from what the backends describe
(``flannel/backend/plan.py``, ``footprint.py``): ``flannel/ops/``, ``cleanup.py`` included,
names no backend, no backend's device, program or engine, and import none of their modules.
Only the backend modules and the registry may."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flannel.backend import supported

FLANNEL = Path(__file__).resolve().parents[2] / "flannel"
TOOLS = sorted((FLANNEL / "ops").rglob("*.py"))
#: "udp" is a protocol too (the tools speak of UDP ports): its backend is caught by its
#: engine's package, its device and its phrases instead.
WORDS = sorted({*supported(), "hostgw", "awsvpc", "alivpc", "tencentvpc", "wireguard-go",
                "charon", "swanctl", "strongswan", "vici"} - {"udp"})
PHRASES = ("udp backend", "udp forwarder", "flannel0", "flannel.1", "flannel-wg",
           "flannel.ipip", "ipsec0", "kernel-libipsec")
#: Modules only a backend may import: its own (all of flannel/backend/ but the contract, its
#: peer admission and the registry), and the engines they run.
SHARED = {"__init__", "base", "plan", "footprint", "admission"}
BACKEND_MODULES = {f"flannel.backend.{p.stem}" for p in (FLANNEL / "backend").glob("*.py")
                   if p.stem not in SHARED}
ENGINES = re.compile(r"flannel\.(udp|wireguard|ipsec|extension|cloud)(\.|$)")


def test_the_tools_are_found():
    assert len(TOOLS) > 10 and FLANNEL / "ops" / "checks" / "probes.py" in TOOLS


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_no_backend_is_named(path: Path):
    text = path.read_text()
    named = [word for word in WORDS
             if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text, re.IGNORECASE)]
    named += [phrase for phrase in PHRASES if phrase in text.lower()]
    assert not named, f"{path.relative_to(FLANNEL)} names {named}"


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_no_backend_module_is_imported(path: Path):
    imported = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
            if node.module == "flannel.backend":  # the registry, or one of its modules
                imported += [f"flannel.backend.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    assert not [name for name in imported if name in BACKEND_MODULES or ENGINES.match(name)
                or any(name.startswith(f"{module}.") for module in BACKEND_MODULES)], imported
