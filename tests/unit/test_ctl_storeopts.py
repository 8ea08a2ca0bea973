"""The store flags of flannelctl: flanneld's names, command line > FLANNELD_* > default."""

from __future__ import annotations

import subprocess

import pytest

from flannel.ctl import build_parser
from flannel.flags import UsageError
from flannel.ops.storeflags import resolve
from flannel.settings import EtcdSettings
from tests.support.checkout import FLANNELCTL


def parsed(*argv: str, environ: dict[str, str] | None = None):
    return resolve(build_parser().parse_args(["leases", "list", *argv]), environ or {})


def test_defaults_are_flanneld_defaults():
    store = parsed()
    assert store.store == EtcdSettings(lease_ttl=24 * 3600, renew_margin=3600)
    assert store.store.endpoints == "http://127.0.0.1:4001,http://127.0.0.1:2379"
    assert store.store.prefix == "/coreos.com/network"
    assert store.subnet_file == "/run/flannel/subnet.env"
    assert not store.kube


def test_command_line_wins_over_environment():
    env = {"FLANNELD_ETCD_ENDPOINTS": "http://10.0.0.1:2379", "FLANNELD_ETCD_PREFIX": "/x"}
    store = parsed("--etcd-endpoints=http://10.0.0.2:2379", environ=env).store
    assert isinstance(store, EtcdSettings)
    assert (store.endpoints, store.prefix) == ("http://10.0.0.2:2379", "/x")


def test_bad_environment_value_is_named():
    with pytest.raises(UsageError) as err:
        parsed(environ={"FLANNELD_KUBE_SUBNET_MGR": "maybe"})
    assert str(err.value) == ("FLANNELD_KUBE_SUBNET_MGR='maybe': 'maybe' is not a boolean "
                              "(use true or false)")


def test_bad_value_exits_2_with_the_message():
    proc = subprocess.run([*FLANNELCTL, "doctor", "--kube-subnet-mgr=maybe"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (
        2, "flannelctl doctor: --kube-subnet-mgr='maybe': 'maybe' is not a boolean (use true "
           "or false)\n")


def test_probe_timeout_is_bounded():
    proc = subprocess.run([*FLANNELCTL, "doctor", "--probe-timeout=1e9"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "'1e9': give seconds from 0.1 to 30" in proc.stderr
