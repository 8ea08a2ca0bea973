"""Runs the real CNI plugin in a fresh interpreter, as a runtime would, and checks its answer.

Each call starts ``python -I -S`` with only the worktree on ``sys.path`` (no site packages,
nothing pre-imported: the way the installed launcher runs it), so behaviour that depends on
which modules happen to be loaded (e.g. ``json``) shows up as it does in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
LAUNCH = ("import sys; sys.path.insert(0, {root!r}); {before}"
          "from flannel.cni.plugin import main; sys.exit(main())")


def pyenv_python(version: str) -> str | None:
    """The pyenv interpreter for ``version`` (e.g. 3.9.18), or None when it is absent."""
    try:
        prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True,
                                timeout=20, check=False).stdout.strip()
    except OSError:
        return None
    major_minor = ".".join(version.split(".")[:2])
    candidate = Path(prefix) / "bin" / f"python{major_minor}"
    return str(candidate) if prefix and candidate.exists() else None


@dataclass
class Answer:
    code: int
    stdout: bytes
    stderr: str

    @property
    def doc(self) -> dict:
        return json.loads(self.stdout)

    def error(self) -> dict:
        """The CNI error object printed, checked for shape; fails the test otherwise."""
        assert self.code != 0, f"expected an error, got exit 0 and {self.stdout!r}"
        doc = json.loads(self.stdout)
        check_error_object(doc)
        return doc


def check_error_object(doc: object) -> None:
    assert isinstance(doc, dict), doc
    assert isinstance(doc.get("cniVersion"), str), doc
    assert isinstance(doc.get("code"), int) and not isinstance(doc["code"], bool), doc
    assert isinstance(doc.get("msg"), str), doc
    assert set(doc) <= {"cniVersion", "code", "msg", "details"}, doc
    assert isinstance(doc.get("details", ""), str), doc
    assert not doc["msg"].startswith("flannel internal error"), doc


def run_plugin(stdin: bytes | dict, env: dict, python: str = sys.executable,
               before: str = "", netns: str | None = None, timeout: float = 60) -> Answer:
    """Run the plugin with ``env`` as its whole environment (plus PATH)."""
    data = json.dumps(stdin).encode() if isinstance(stdin, dict) else stdin
    cmd = [python, "-I", "-S", "-c", LAUNCH.format(root=ROOT, before=before)]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    full_env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env}
    proc = subprocess.run(cmd, input=data, env=full_env, capture_output=True,
                          timeout=timeout, check=False)
    return Answer(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"))


def cni_env(command: str, container_id: str = "c1", cni_path: str = "/usr/lib/cni",
            netns: str = "/run/netns/none", ifname: str = "eth0") -> dict:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": ifname, "CNI_PATH": cni_path}


def write_delegate(directory: Path, name: str, script: str) -> Path:
    """A tiny executable delegate (``#!/bin/sh`` script) for delegates that misbehave."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path
