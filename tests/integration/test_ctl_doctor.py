"""What doctor gathers from a real etcd (its clock, its leases) and from the kube API test
double (tests/support/kubeapi.py)."""

from __future__ import annotations

from pathlib import Path

from flannel.ctl import build_parser
from flannel.ops.checks import Context
from flannel.ops.doctor import _etcd_clock_skew, read_store
from flannel.ops.storeflags import StoreOptions, resolve
from tests.support.kubeapi import FakeKubeAPI

CONFIG = '{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}'


def doctor_args(*argv: str) -> StoreOptions:
    return resolve(build_parser().parse_args(["doctor", *argv]), {})


def context() -> Context:
    return Context(subnet_file=Path("/nonexistent"), sysctl_root=Path("/proc/sys"),
                   cni_bin_dirs=[], cni_conf_dirs=[], probe_timeout=1.0, fix_checksum=False)


def test_clock_skew_against_etcd_is_measured(etcd):
    skew = _etcd_clock_skew(doctor_args(f"--etcd-endpoints={etcd.endpoint}").store, 3.0)
    assert skew is not None
    assert abs(skew) < 2.0  # same machine, same clock


def test_clock_skew_of_an_unreachable_etcd_is_unknown():
    assert _etcd_clock_skew(doctor_args("--etcd-endpoints=http://127.0.0.1:9").store,
                            1.0) is None


async def test_etcd_leases_and_config(etcd, prefix):
    etcd.ctl("put", f"{prefix}/config", CONFIG)
    etcd.ctl("put", f"{prefix}/subnets/10.244.5.0-24", '{"PublicIP":"192.168.1.5"}')
    ctx = context()
    await read_store(ctx, doctor_args(f"--etcd-endpoints={etcd.endpoint}",
                                      f"--etcd-prefix={prefix}"))
    assert ctx.store_error == ""
    assert [str(lease.subnet) for lease in ctx.leases] == ["10.244.5.0/24"]
    assert str(ctx.config.network) == "10.244.0.0/16"
    assert ctx.clock_skew is not None


async def test_kube_leases_and_config(tmp_path):
    api = FakeKubeAPI()
    await api.start()
    try:
        p = "flannel.alpha.coreos.com/"
        api.put_node("node-a", ["10.244.3.0/24"], {
            p + "kube-subnet-manager": "true", p + "backend-type": "vxlan",
            p + "backend-data": '{"VNI":1,"VtepMAC":"0e:00:00:00:00:03"}',
            p + "public-ip": "192.168.1.13"})
        conf = tmp_path / "net-conf.json"
        conf.write_text(CONFIG)
        ctx = context()
        await read_store(ctx, doctor_args("--kube-subnet-mgr", f"--kube-api-url={api.url}",
                                          f"--net-config-path={conf}"))
    finally:
        await api.stop()
    assert ctx.store_error == ""
    assert [(str(lease.subnet), str(lease.attrs.public_ip)) for lease in ctx.leases] == [
        ("10.244.3.0/24", "192.168.1.13")]
    assert ctx.config.backend_type == "vxlan"


async def test_unreachable_store_is_recorded():
    ctx = context()
    await read_store(ctx, doctor_args("--etcd-endpoints=http://127.0.0.1:9"))
    assert ctx.rows is None
    assert ctx.store_error
