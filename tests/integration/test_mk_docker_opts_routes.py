"""mk-docker-opts refuses a subnet the routing table already sends through a gateway, as
upstream's script does: after writing its file, it exits 1 naming the route. Run in a
network namespace of the test's own, with a real routing table."""

import subprocess

from tests.support import netns
from tests.support.checkout import MK_DOCKER_OPTS


def run_in(ns: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *MK_DOCKER_OPTS, *argv],
                          capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def test_a_subnet_routed_via_a_gateway_is_reported_after_the_file_is_written(ns, tmp_path):
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "eth0", netns=ns)
    netns.ip("link", "set", "eth0", "up", netns=ns)
    netns.ip("link", "set", "eth1", "up", netns=ns)
    src, dst = tmp_path / "subnet.env", tmp_path / "docker_opts.env"
    src.write_text("FLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n")

    assert run_in(ns, "-f", str(src), "-d", str(dst)).returncode == 0

    netns.ip("route", "add", "10.1.74.0/24", "via", "10.99.0.1", netns=ns)
    dst.unlink()
    result = run_in(ns, "-f", str(src), "-d", str(dst))
    assert (result.returncode, result.stderr) == (
        1, "Your routing table already contains the subnet: "
           "10.1.74.0/24 via 10.99.0.1 dev eth0\n")
    assert dst.read_text().startswith('DOCKER_OPT_BIP="--bip=10.1.74.1/24"\n')
