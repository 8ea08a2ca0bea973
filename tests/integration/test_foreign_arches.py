"""pyflannel on other architectures: Debian bookworm's own python3 for arm64 and s390x (a
big-endian one), in roots made with ``debootstrap --foreign`` (tests/support/foreign_roots.py),
holding pyflannel and the pure Python files of its runtime dependencies (compiled modules left
out). Each root's interpreter runs under qemu-user-static, called explicitly; no binfmt handler
is registered. ``flanneld --version`` answers without loading a store client; a network
config, a lease (key and value) and a kubeconfig decode there exactly as on this machine; a
hostile lease is refused with the same message.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from flannel.version import __version__
from tests.support import foreign_roots

pytestmark = [pytest.mark.foreign, pytest.mark.timeout(1800),
              pytest.mark.skipif(shutil.which("debootstrap") is None,
                                 reason="needs debootstrap (./install.sh installs it)"),
              pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap needs root")]

CONFIG = json.dumps({"Network": "10.244.0.0/16", "SubnetLen": 24, "EnableIPv6": True,
                     "IPv6Network": "fd00:10:244::/56", "IPv6SubnetLen": 64,
                     "Backend": {"Type": "vxlan", "VNI": 4096, "Port": 4789}})
LEASE_KEY = "10.244.7.0-24&fd00:10:244:7::-64"
LEASE_VALUE = json.dumps({"PublicIP": "192.0.2.17", "PublicIPv6": "2001:db8::17",
                          "BackendType": "vxlan",
                          "BackendData": {"VNI": 4096, "VtepMAC": "f2:3c:91:0a:7e:01"}})
HOSTILE_LEASE = '{"PublicIP": "192.0.2.300", "BackendType": "vxlan"}'
# As kubectl writes one; insecure-skip-tls-verify "yes" is YAML 1.1's true, as in client-go.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- cluster:
    server: https://10.0.0.1:6443
    insecure-skip-tls-verify: yes
  name: edge
contexts:
- context: {cluster: edge, user: flannel}
  name: ctx
current-context: ctx
users:
- name: flannel
  user:
    token: abc
"""

DECODE = """
import json, platform, ssl, sys
from flannel import config, lease
from flannel.clients.kube.config import from_kubeconfig
cfg = config.parse_config(sys.argv[1])
config.check_network_config(cfg)
subnet, ipv6_subnet = lease.parse_subnet_key(sys.argv[2])
attrs = lease.LeaseAttrs.from_json(sys.argv[3])
try:
    lease.LeaseAttrs.from_json(sys.argv[4])
    refused = None
except lease.LeaseDecodeError as err:
    refused = str(err)
kube = from_kubeconfig(sys.argv[5])
print(json.dumps({
    "machine": platform.machine(), "byteorder": sys.byteorder,
    "config": [str(cfg.network), cfg.subnet_len, str(cfg.subnet_min), str(cfg.subnet_max),
               str(cfg.ipv6_network), cfg.ipv6_subnet_len, str(cfg.ipv6_subnet_min),
               str(cfg.ipv6_subnet_max), cfg.backend_type, cfg.backend],
    "lease": [str(subnet), str(ipv6_subnet), str(attrs.public_ip), str(attrs.public_ipv6),
              attrs.backend_type, attrs.backend_json()],
    "reencoded": attrs.to_json(), "refused": refused,
    "kubeconfig": [kube.host, kube.port, kube.context.verify_mode == ssl.CERT_NONE,
                   type(kube.credentials).__name__],
}))
"""


def flanneld_entry_point() -> str:
    """What the installed ``flanneld`` console script runs, as its wrapper would; at exit, the
    store clients and their libraries that were loaded go to stdout (none should be)."""
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="flanneld")
    module, _, function = entry.value.partition(":")
    return ("import atexit, sys; atexit.register(lambda: print(sorted(m for m in sys.modules "
            "if m.startswith(('flannel.subnet', 'flannel.clients', 'h11', 'ruamel')))))\n"
            f"from {module} import {function}; sys.argv[0] = 'flanneld'; "
            f"sys.exit({function}())")


@pytest.mark.parametrize("name", sorted(foreign_roots.ARCHES))
def test_runtime_runs_on_debian_python_of(name, tmp_path):
    arch = foreign_roots.ARCHES[name]
    if shutil.which(f"qemu-{arch.qemu}-static") is None:
        pytest.skip("needs qemu-user-static (./install.sh installs it)")
    started = time.monotonic()
    root = foreign_roots.extract(arch, tmp_path / "root")
    ready = time.monotonic()
    left_out = foreign_roots.install_runtime(root)
    binary = subprocess.run(["file", "-L", f"{root}{foreign_roots.PYTHON}"],
                            capture_output=True, text=True, timeout=30, check=True).stdout
    assert ("aarch64" if name == "arm64" else "IBM S/390") in binary, binary

    version = foreign_roots.run(arch, root, "-c", flanneld_entry_point(), "--version")
    ran = time.monotonic()
    assert (version.returncode, version.stderr.strip()) == (0, __version__), version
    assert version.stdout.strip() == "[]", "flanneld --version loaded a store client"

    (root / "etc" / "kubeconfig").write_text(KUBECONFIG)
    args = (CONFIG, LEASE_KEY, LEASE_VALUE, HOSTILE_LEASE)
    there = foreign_roots.run(arch, root, "-c", DECODE, *args, "/etc/kubeconfig")
    decoded = time.monotonic()
    assert there.returncode == 0, there.stderr
    here = subprocess.run([sys.executable, "-c", DECODE, *args, str(root / "etc/kubeconfig")],
                          capture_output=True, text=True, timeout=60, check=True)
    foreign, native = json.loads(there.stdout), json.loads(here.stdout)
    assert (foreign.pop("machine"), foreign.pop("byteorder")) == (arch.machine, arch.byteorder)
    del native["machine"], native["byteorder"]
    assert foreign == native
    assert foreign["lease"][:2] == ["10.244.7.0/24", "fd00:10:244:7::/64"]
    assert foreign["lease"][5] == {"VNI": 4096, "VtepMAC": "f2:3c:91:0a:7e:01"}
    assert "192.0.2.300" in foreign["refused"]
    assert foreign["kubeconfig"] == ["10.0.0.1", 6443, True, "StaticToken"]
    print(f"\n{name}: root ready in {ready - started:.1f} s, flanneld --version "
          f"{ran - ready:.1f} s, decoding {decoded - ran:.1f} s; compiled modules left out: "
          f"{left_out or 'none'}")
