"""No backend is named outside its own modules and the registry.

The operator tools judge and clean a node from what the backends describe
(``flannel/backend/plan.py``, ``footprint.py``): ``flannel/ops/``, ``cleanup.py`` included,
names no backend, no backend's device, program or engine, not even in a comment, and imports
none of their modules.

The rest of the runtime package (``flannel/``) is held to the same rule in its code: no
string constant (docstrings apart) names a backend, and no module imports a backend's module
or engine. A name that is only a backend's (``host-gw``, ``wireguard``, ``charon``, a
device's name) may not appear in any such string; a name that is also a kernel link kind,
an IP protocol or a plain word (``vxlan``, ``udp``, ``ipip``, ``extension``, ``alloc``) may
not be a string of its own: that is how a backend choice looks in code (``kind ==
"alloc"``, a default, a key). ``ALLOWED`` lists the few that stay, each with its reason.
"""

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
ENGINE_PACKAGES = ("udp", "wireguard", "ipsec", "extension", "cloud")
ENGINES = re.compile(rf"flannel\.({'|'.join(ENGINE_PACKAGES)})(\.|$)")

#: The runtime package but the backends' own modules (their engines included) and the
#: registry, which alone may name them.
RUNTIME = sorted(
    path for path in FLANNEL.rglob("*.py")
    if path.relative_to(FLANNEL).parts[0] not in ENGINE_PACKAGES
    and not (path.parent == FLANNEL / "backend" and path.stem not in SHARED - {"__init__"}))
#: Names that are also a link kind, an IP protocol or a plain word: refused only as a
#: string of their own.
AMBIGUOUS = frozenset({"vxlan", "udp", "ipip", "extension", "alloc"})
#: Names that are only a backend's, its devices' or its programs': refused in any string.
ONLY_BACKENDS = tuple(sorted({*supported(), "hostgw", "awsvpc", "alivpc", "tencentvpc",
                              "wireguard-go", "charon", "swanctl", "strongswan", "vici"}
                             - AMBIGUOUS)) + PHRASES
#: What stays, by module and name, with its reason.
ALLOWED: dict[str, dict[str, str]] = {
    # Go flannel's defaulting rule (config.go): a config without Backend runs udp.
    "config.py": {"udp": "Go's default backend when Backend is absent"},
    # Go's AcquireLease publishes the backend data annotations per backend type: a wire
    # rule of the Kubernetes store, whose result other Go nodes read.
    "subnet/kube/annotations.py": {
        "vxlan": "Go's per-backend rule of which annotations to publish",
        "wireguard": "Go's per-backend rule of which annotations to publish",
        "host-gw": "Go's per-backend rule of which annotations to publish",
        "extension": "Go's per-backend rule of which annotations to publish"},
    # Go's kube subnet manager starts no node informer for alloc: no node list or watch
    # reaches the API server.
    "subnet/kube/manager.py": {"alloc": "Go starts no node watch for alloc"},
    # cleanup's --wireguard-key-file, the counterpart of flanneld's WIREGUARD_KEY_FILE (Go's
    # variable for that backend's key): a flag users already give.
    "ctl.py": {"wireguard": "the --wireguard-key-file flag's help"},
    # Kernel link kinds (IFLA_INFO_KIND) and IP protocol words, not backend choices.
    "kernel/links.py": {"vxlan": "link kind", "ipip": "link kind"},
    "kernel/device.py": {"vxlan": "link kind"},
    "kernel/ipipdev.py": {"ipip": "link kind"},
    "rules/iptables.py": {"udp": "IP protocol (iptables -p udp)"},
    "ops/firewall.py": {"udp": "IP protocol (nft/iptables match)"},
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that stand as statements of their own: docstrings of
    modules, classes, functions and attributes (what a comment would say)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def backend_names(source: str) -> set[str]:
    """The backend names the code of ``source`` holds in its string constants."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) \
                or id(node) in prose:
            continue
        text = node.value.lower()
        if text in AMBIGUOUS:
            found.add(text)
        found.update(name for name in ONLY_BACKENDS
                     if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text))
    return found


def imported_modules(source: str) -> list[str]:
    imported = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
            if node.module == "flannel.backend":  # the registry, or one of its modules
                imported += [f"flannel.backend.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    return imported


def backend_imports(source: str) -> list[str]:
    return [name for name in imported_modules(source)
            if name in BACKEND_MODULES or ENGINES.match(name)
            or any(name.startswith(f"{module}.") for module in BACKEND_MODULES)]


def test_the_tools_are_found():
    assert len(TOOLS) > 10 and FLANNEL / "ops" / "checks" / "probes.py" in TOOLS


def test_the_runtime_is_found_without_the_backends():
    names = {str(path.relative_to(FLANNEL)) for path in RUNTIME}
    assert {"daemon.py", "config.py", "subnet/kube/manager.py", "backend/plan.py",
            "ops/cleanup.py", "kernel/links.py"} <= names
    assert not names & {"backend/__init__.py", "backend/vxlan.py", "udp/worker.py",
                        "wireguard/device.py", "cloud/gce.py"}


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_no_backend_is_named(path: Path):
    text = path.read_text()
    named = [word for word in WORDS
             if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text, re.IGNORECASE)]
    named += [phrase for phrase in PHRASES if phrase in text.lower()]
    assert not named, f"{path.relative_to(FLANNEL)} names {named}"


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_no_backend_module_is_imported(path: Path):
    assert not backend_imports(path.read_text())


@pytest.mark.parametrize("path", RUNTIME, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_the_runtime_names_no_backend_in_its_code(path: Path):
    module = str(path.relative_to(FLANNEL))
    named = backend_names(path.read_text()) - set(ALLOWED.get(module, {}))
    assert not named, f"{module} names {sorted(named)}: move the choice behind the " \
                      "backend's declaration (its Footprint, Description or a class attribute)"


@pytest.mark.parametrize("path", RUNTIME, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_the_runtime_imports_no_backend_module(path: Path):
    assert not backend_imports(path.read_text()), path.relative_to(FLANNEL)


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_every_allowance_is_still_needed(module: str):
    """An allowance whose name is gone from its module is removed with it."""
    named = backend_names((FLANNEL / module).read_text())
    assert set(ALLOWED[module]) <= named, f"{module} no longer names " \
                                          f"{sorted(set(ALLOWED[module]) - named)}"


def test_a_backend_choice_is_found_and_prose_is_not():
    assert backend_names('if kind == "alloc":\n    pass\n') == {"alloc"}
    assert backend_names('DEFAULT = "UDP"\n') == {"udp"}
    assert backend_names('MESSAGE = f"stop {name}: charon still runs"\n') == {"charon"}
    assert backend_names('LINK = "flannel.1"\n') == {"flannel.1"}
    assert backend_names('HELP = "the wireguard-go socket"\n') == {"wireguard-go"}
    assert backend_names('"""Runs with host-gw or wireguard."""\n'
                         'def f():\n    """Not for alloc."""\n    # nor for "ipsec"\n'
                         '    return "a udp port, a vxlan header"\n') == set()
    assert backend_imports("from flannel.backend import vxlan\n"
                           "import flannel.wireguard.keys\n"
                           "from flannel.backend.plan import Description\n") == [
        "flannel.backend.vxlan", "flannel.wireguard.keys"]
