"""Files a user names are read without blocking: a FIFO (or device) at the path is refused at
once with a message naming it, never waited on."""

from __future__ import annotations

import os

import pytest

from flannel.clients.kube.config import KubeConfigError, from_kubeconfig
from flannel.files.fileutil import read_head


def test_a_fifo_as_the_kubeconfig_is_refused_at_once(tmp_path):
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig(str(fifo))
    assert str(err.value) == (f"cannot read the kubeconfig file {fifo}: Not a regular file "
                              "but a FIFO")


@pytest.mark.parametrize(("path", "kind"), [("/dev/null", "a character device"),
                                            ("/dev/zero", "a character device")])
def test_a_device_is_not_read(path, kind):
    with pytest.raises(OSError) as err:
        read_head(path, 10)
    assert err.value.strerror == f"Not a regular file but {kind}"
