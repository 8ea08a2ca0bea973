"""How cleanup recognises flannel's files and processes: anything else is kept."""

from __future__ import annotations

import json

import pytest

from flannel.cni.install import DEFAULT_CONFLIST, launcher_text
from flannel.ops.cleanup import (
    Inventory,
    file_items,
    is_flannel_conflist,
    is_our_launcher,
    is_subnet_env,
)
from flannel.process.procscan import is_flanneld


@pytest.mark.parametrize(("text", "ours"), [
    ("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\nFLANNEL_MTU=1450\n"
     "FLANNEL_IPMASQ=false\n", True),
    ("FLANNEL_IPV6_NETWORK=fd05::/48\nFLANNEL_IPV6_SUBNET=fd05:0:0:1::1/64\n", True),
    ("FLANNEL_NETWORK=10.5.0.0/16\n", False),  # no subnet: not what flanneld writes
    ("FLANNEL_SUBNET=10.5.1.1/24\nPATH=/tmp\n", False),  # a foreign setting
    ("", False),
])
def test_subnet_env_recognition(text, ours):
    assert is_subnet_env(text) is ours


def test_launcher_and_conflist_recognition(tmp_path):
    assert is_our_launcher(launcher_text("/usr/bin/python3", "0.1.0-0123456789ab"))
    assert not is_our_launcher("#!/bin/sh\nexec /opt/flannel \"$@\"\n")
    assert is_flannel_conflist(json.dumps(DEFAULT_CONFLIST))
    assert not is_flannel_conflist('{"plugins": [{"type": "calico"}]}')
    assert not is_flannel_conflist("[1, 2]")
    assert not is_flannel_conflist("not json")
    # Nested past the recursion limit: not ours, and no crash (cleanup leaves it alone).
    assert not is_flannel_conflist("{\"plugins\":" + "[" * 3000 + "]" * 3000 + "}")


def test_symlinks_and_large_files_are_never_followed_or_taken(tmp_path):
    real = tmp_path / "elsewhere.env"
    real.write_text("FLANNEL_SUBNET=10.5.1.1/24\n")
    link = tmp_path / "subnet.env"
    link.symlink_to(real)
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "conf"
    bin_dir.mkdir()
    conf_dir.mkdir()
    (bin_dir / "flannel").write_bytes(b"#!" + b"x" * 70000 + b"flannel.cni.plugin")
    (bin_dir / ".flannel-cni").mkdir()  # empty: not our module directory
    found = Inventory()
    file_items(found, link, [bin_dir], [conf_dir])
    assert found.items == []
    assert [kept.split(":")[0] for kept in found.kept] == [
        f"file {link}", f"file {bin_dir / 'flannel'}", str(bin_dir / ".flannel-cni")]
    assert real.exists()


@pytest.mark.parametrize(("cmdline", "match"), [
    (b"/opt/bin/flanneld\0--ip-masq\0", True),
    (b"/usr/bin/python3\0/opt/pyflannel/bin/flanneld\0--kube-subnet-mgr\0", True),
    (b"/usr/bin/tail\0-f\0/var/log/flanneld\0", False),
    (b"/usr/bin/flanneld-helper\0", False),
    (b"", False),
])
def test_flanneld_process_recognition(cmdline, match):
    assert is_flanneld(cmdline) is match
