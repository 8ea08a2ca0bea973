"""install-conf SRC DEST: the init container's conflist install, as upstream's
cmd/install_conf does it (v0.28.9): SRC's bytes and mode replace DEST by a rename."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.checkout import INSTALL_CONF

CONFLIST = b'{\n  "name": "cbr0",\n  "cniVersion": "0.3.1",\n  "plugins": []\n}\n'


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*INSTALL_CONF, *argv], capture_output=True, text=True, timeout=30,
                          check=False, env={"PATH": os.environ.get("PATH", "")})


def configmap(tmp_path: Path, data: bytes = CONFLIST, mode: int = 0o644) -> Path:
    """A ConfigMap volume's layout: the key is a symlink into the ..data directory."""
    volume = tmp_path / "kube-flannel"
    (volume / "..2026_01_01").mkdir(parents=True)
    (volume / "..data").symlink_to("..2026_01_01")
    real = volume / "..2026_01_01" / "cni-conf.json"
    real.write_bytes(data)
    real.chmod(mode)
    (volume / "cni-conf.json").symlink_to("..data/cni-conf.json")
    return volume / "cni-conf.json"


def test_copies_the_bytes_and_the_mode(tmp_path):
    src = configmap(tmp_path, mode=0o640)
    netd = tmp_path / "net.d"
    netd.mkdir()
    result = run(str(src), str(netd / "10-flannel.conflist"))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    dest = netd / "10-flannel.conflist"
    assert dest.read_bytes() == CONFLIST
    assert not dest.is_symlink() and dest.stat().st_mode & 0o7777 == 0o640
    assert [p.name for p in netd.iterdir()] == ["10-flannel.conflist"]


def test_replaces_the_old_file_by_a_rename(tmp_path):
    """A runtime that opened the old conflist reads all of it: the new one is a new file."""
    src = configmap(tmp_path)
    netd = tmp_path / "net.d"
    netd.mkdir()
    dest = netd / "10-flannel.conflist"
    dest.write_bytes(b'{"name": "old"}\n')
    with dest.open("rb") as reader:
        assert run(str(src), str(dest)).returncode == 0
        assert reader.read() == b'{"name": "old"}\n'
    assert dest.read_bytes() == CONFLIST
    assert [p.name for p in netd.iterdir()] == ["10-flannel.conflist"]


def test_a_symlink_at_dest_is_replaced_not_followed(tmp_path):
    src = configmap(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    dest = tmp_path / "10-flannel.conflist"
    dest.symlink_to(victim)
    assert run(str(src), str(dest)).returncode == 0
    assert victim.read_text() == "keep\n"
    assert not dest.is_symlink() and dest.read_bytes() == CONFLIST


@pytest.mark.parametrize("argv", [(), ("only-one",), ("a", "b", "c")])
def test_anything_but_two_arguments_prints_usage(argv):
    result = run(*argv)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"usage: {INSTALL_CONF[-1]} <src> <dest>\n"


def test_a_missing_source_is_refused_and_dest_kept(tmp_path):
    dest = tmp_path / "10-flannel.conflist"
    dest.write_text("keep\n")
    missing = tmp_path / "cni-conf.json"
    result = run(str(missing), str(dest))
    assert result.returncode == 1
    assert result.stderr == (f'error installing "{missing}": cannot open it: No such file or '
                             "directory; give the CNI config file, such as the ConfigMap's "
                             "cni-conf.json\n")
    assert dest.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10-flannel.conflist"]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_source_that_is_not_a_file_is_refused_without_blocking(tmp_path, kind):
    src = tmp_path / "cni-conf.json"
    if kind == "fifo":
        os.mkfifo(src)
    else:
        src.mkdir()
    result = run(str(src), str(tmp_path / "10-flannel.conflist"))
    assert result.returncode == 1
    assert "not a regular file" in result.stderr
    assert not (tmp_path / "10-flannel.conflist").exists()


def test_an_oversized_source_is_refused(tmp_path):
    src = configmap(tmp_path, data=b" " * (1024 * 1024 + 1))
    result = run(str(src), str(tmp_path / "10-flannel.conflist"))
    assert result.returncode == 1
    assert "larger than 1048576 bytes" in result.stderr
    assert not (tmp_path / "10-flannel.conflist").exists()


def test_a_missing_dest_directory_is_refused_not_made(tmp_path):
    src = configmap(tmp_path)
    dest = tmp_path / "net.d" / "10-flannel.conflist"
    result = run(str(src), str(dest))
    assert result.returncode == 1
    assert result.stderr == (f'error installing "{src}": {tmp_path / "net.d"} is not a '
                             "directory; mount the host's CNI config directory there\n")
    assert not (tmp_path / "net.d").exists()
