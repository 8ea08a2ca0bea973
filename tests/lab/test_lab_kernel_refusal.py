"""``flannel-lab up`` with a backend whose device this kernel cannot make (ipip without the
ipip module) is refused before anything is built, in one line, with exit status 2, as
flanneld would exit at start; the probe leaves no namespace behind."""

from __future__ import annotations

import subprocess

import pytest

from flannel_lab.cli import main as lab_main
from tests.support import netns
from tests.support.kernelpaths import missing_ipip

pytestmark = pytest.mark.netns


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_ipip_on_a_kernel_without_it_is_refused_before_building(tmp_path, capsys):
    if not missing_ipip():
        pytest.skip("this kernel makes ipip devices: flanneld would not refuse")
    root = tmp_path / "labs"
    name = f"{netns.RUN_PREFIX}ni"
    code = lab_main(["--root", str(root), "up", "--name", name, "--backend", "ipip"])
    assert code == 2
    assert capsys.readouterr() == ("", (
        "flannel-lab: the ipip backend makes ipip devices, and this kernel cannot make ipip "
        "devices (no ipip driver built in, none loaded, no module to load): flanneld would "
        "exit at start; load the ipip module on the host ('modprobe ipip'), or choose another "
        "backend\n"))
    assert not root.exists()
    assert not {ns for ns in netns_names() if ns.startswith(f"{name}-")}
