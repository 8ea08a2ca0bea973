"""docs/architecture.md cannot drift from the code: every module path it cites exists.

What counts as a citation, in the document's code spans and its layout diagram:
- a path ending in ``.py`` or ``/`` with a directory in it (``flannel/subnet/watch.py``,
  ``clients/``, ``kernel/iface.py``): from the repository's root, else from ``flannel/``
  (the document's short form);
- a bare file or directory name (``kv.py``, ``kube/``): one of that name somewhere in the
  repository's code;
- a dotted name under ``flannel`` or ``flannel_lab`` (``flannel.clients.fetch``,
  ``flannel.backend.register``): a module, or a name a module defines.
Placeholders (``backend/<type>.py``), absolute paths (``/run/flannel/subnet.env``) and the
device names that look like modules (``flannel.ipip``) are not citations.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
#: Device names spelt like modules.
DEVICES = {"flannel.ipip"}
CODE_ROOTS = ("flannel/", "lab/", "tests/", "bench/", "deploy/")
#: A dotted name under the runtime or the lab package (a ``.py`` file name is a path).
_DOTTED = re.compile(r"flannel(_lab)?(\.[A-Za-z_]\w*)+")


def _code_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return [name for name in listed if name.startswith(CODE_ROOTS)]


def _tokens(text: str) -> set[str]:
    spans = re.findall(r"`([^`\n]+)`", text)
    diagram = "\n".join(re.findall(r"^```\n(.*?)^```$", text, re.M | re.S))
    found = set()
    for piece in [*spans, diagram]:
        for token in re.split(r"[\s,()\[\]{}:;|]+", piece):
            token = token.strip(".'\"")
            if "<" in token or "*" in token or token.startswith("/"):
                continue
            if re.fullmatch(r"[\w./-]+(\.py|/)", token) or _DOTTED.fullmatch(token):
                found.add(token)
    return found


def _dotted_exists(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:  # a name inside a module, not a submodule
            continue
        found: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _names(files: list[str]) -> set[str]:
    """Every file's name and every directory's name (``kube/``) in the code."""
    names = set()
    for name in files:
        path = Path(name)
        names.add(path.name)
        names.update(f"{parent.name}/" for parent in path.parents if parent.name)
    return names


def _path_exists(token: str, names: set[str]) -> bool:
    if "/" not in token.rstrip("/"):
        return token in names
    return (ROOT / token).exists() or (ROOT / "flannel" / token).exists()


def test_every_module_path_the_architecture_cites_exists():
    names = _names(_code_files())
    tokens = _tokens(DOC.read_text())
    assert len(tokens) > 150, "the citations were not found: has the document's form changed?"
    missing = sorted(token for token in tokens if token not in DEVICES and not (
        _dotted_exists(token) if _DOTTED.fullmatch(token) and not token.endswith(".py")
        else _path_exists(token, names)))
    assert missing == [], f"docs/architecture.md cites what does not exist: {missing}"


def test_the_check_finds_a_stale_citation():
    """What the test above relies on: a moved module is caught in each form."""
    names = _names(_code_files())
    assert not _path_exists("flannel/httpclient.py", names)
    assert not _path_exists("subnet/etcd/client.py", names)
    assert not _path_exists("dataplane.py", names)
    assert not _dotted_exists("flannel.lab")
    assert not _dotted_exists("flannel.clients.etcd.StoreError")
    assert _path_exists("subnet/etcd/kv.py", names) and _path_exists("kube/", names)
    assert _dotted_exists("flannel.clients.etcd")
    # A file whose name starts like the package is a path, not a dotted name.
    assert _path_exists("flanneldview.py", names) and not _path_exists("flanneldgone.py", names)
