"""The standard library's answers, without loading what an idle flanneld does not need:
``fileutil.which`` finds what ``shutil.which`` finds, ``flannel.digests`` gives hashlib's
bytes (a VTEP MAC and a node's starting subnet must not change with the implementation)."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from flannel import digests
from flannel.files.fileutil import which


@pytest.mark.parametrize("name", ["sh", "ip", "no-such-command-here", "/bin/sh", "/nonexistent"])
def test_which_finds_what_shutil_finds(name):
    assert which(name) == shutil.which(name)


def test_which_skips_directories_and_files_that_are_not_executable(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "tool").mkdir()  # a directory by that name
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tool").write_text("#!/bin/sh\n")  # not executable
    (tmp_path / "c").mkdir()
    tool = tmp_path / "c" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join(str(tmp_path / d) for d in "abc"))
    assert which("tool") == shutil.which("tool") == str(tool)


@pytest.mark.parametrize("data", [b"", b"flannel-vtep|1|10.0.0.1", bytes(range(256)) * 5])
def test_digests_are_hashlibs(data):
    assert digests.sha256(data) == hashlib.sha256(data).digest()
    assert digests.blake2b(data, 32) == hashlib.blake2b(data, digest_size=32).digest()
    assert digests.blake2b(data, 8) == hashlib.blake2b(data, digest_size=8).digest()
