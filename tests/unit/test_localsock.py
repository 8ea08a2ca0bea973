"""flanneld's local socket on a real filesystem: made root-only, a stale one replaced, a live
one, a symlink or a file at its name left alone, reachable at any path length."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from flannel.monitor.localsock import SocketError, connect, listen, socket_path


def test_socket_is_next_to_subnet_env_mode_0600_in_a_0755_directory(tmp_path):
    path = socket_path(tmp_path / "made" / "subnet.env")
    assert path == tmp_path / "made" / "flanneld.sock"
    old = os.umask(0o000)  # a permissive umask changes nothing
    try:
        local = listen(path)
    finally:
        os.umask(old)
    try:
        info = os.lstat(path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755
        connect(path, 1.0).close()
    finally:
        local.sock.close()
        local.remove()
    assert not path.exists()


def test_a_stale_socket_is_replaced(tmp_path):
    path = tmp_path / "flanneld.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # bound, never listening: what a killed flanneld leaves
    with pytest.raises(ConnectionRefusedError):
        connect(path, 1.0)
    local = listen(path)
    try:
        connect(path, 1.0).close()
    finally:
        local.sock.close()
        local.remove()


def test_a_live_socket_is_not_taken_over(tmp_path):
    path = tmp_path / "flanneld.sock"
    first = listen(path)
    try:
        with pytest.raises(SocketError, match="another flanneld listens on"):
            listen(path)
        connect(path, 1.0).close()  # the first one still serves
    finally:
        first.sock.close()
        first.remove()


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_what_is_not_our_socket_is_left_alone(tmp_path, kind):
    path = tmp_path / "flanneld.sock"
    target = tmp_path / "precious"
    target.write_text("keep me")
    if kind == "symlink":
        path.symlink_to(target)
    else:
        path.write_text("keep me")
    with pytest.raises(SocketError, match="is not a socket of flanneld's user; remove it"):
        listen(path)
    assert path.is_symlink() == (kind == "symlink")
    assert target.read_text() == "keep me"
    with pytest.raises(OSError) as refused:
        connect(path, 1.0)
    assert refused.value.errno == errno.ENOTSOCK


def test_a_path_longer_than_a_socket_address_works(tmp_path):
    deep = tmp_path / ("d" * 100) / ("e" * 100)
    path = socket_path(deep / "subnet.env")
    assert len(str(path)) > 108
    local = listen(path)
    try:
        connect(path, 1.0).close()
    finally:
        local.sock.close()
        local.remove()
    assert not Path(path).exists()
