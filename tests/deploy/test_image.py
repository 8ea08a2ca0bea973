"""The container image, built as CI builds it: deploy/build-image.sh with Debian's buildah
(chroot isolation) on a local debootstrap stand-in for the pinned debian:bookworm-slim base
(made as Debian makes it, see rootfs.py), since no registry is reachable here. Then flanneld
and flannelctl run inside it as the DaemonSet runs them, with the tools flanneld execs doing
their work in a network namespace of the test's own, and the image holds no installers nor
anything of the Debian base that nothing runs, has bytecode for what flanneld loads, and stays
under its size target."""

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from flannel.version import __version__
from flannel_lab.etcd import EtcdServer
from tests.deploy import images
from tests.deploy.manifests import BASE, documents, pod_spec
from tests.support import netns
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
SIZE_TARGET = 100 * 1000 * 1000


def test_flanneld_runs_and_says_its_version(box):
    result = images.run(box, "flanneld", "--version")
    assert (result.returncode, result.stderr) == (0, f"{__version__}\n")


def test_labels_name_version_revision_and_source(image):
    labels = images.inspect(image)["OCIv1"]["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True, timeout=30).stdout.strip()
    assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")
    assert labels["org.opencontainers.image.source"]


def test_install_cni_writes_into_a_host_directory(box, tmp_path):
    result = images.run(box, "flannelctl", "install-cni", "--bin-dir", "/host/bin",
                        "--conf-dir", "/host/net.d", volumes=((tmp_path, "/host"),))
    assert result.returncode == 0, result.stderr
    conflist = json.loads((tmp_path / "net.d" / "10-flannel.conflist").read_text())
    assert conflist["name"] == "cbr0"
    assert [p["type"] for p in conflist["plugins"]] == ["flannel", "portmap"]


def test_manifest_init_container_installs_only_the_conflist(box, tmp_path):
    """The DaemonSet's install-cni container, run as written with its mounts: the host's conf
    dir gets the ConfigMap's conflist, and nothing reaches the host's CNI bin dir."""
    docs = documents(BASE)
    init = pod_spec(docs)["initContainers"][1]
    host = {"cni": tmp_path / "net.d", "flannel-cfg": tmp_path / "cfg",
            "cni-plugin": tmp_path / "bin"}
    for directory in host.values():
        directory.mkdir()
    cni_conf = docs["ConfigMap/kube-flannel-cfg"]["data"]["cni-conf.json"]
    (host["flannel-cfg"] / "cni-conf.json").write_text(cni_conf)
    mounts = tuple((host[m["name"]], m["mountPath"]) for m in init["volumeMounts"])
    result = images.run(box, *init["command"], *init["args"], volumes=mounts)
    assert result.returncode == 0, result.stderr
    assert json.loads((host["cni"] / "10-flannel.conflist").read_text()) == json.loads(cni_conf)
    assert [p.name for p in host["cni"].iterdir()] == ["10-flannel.conflist"]
    assert list(host["cni-plugin"].iterdir()) == []


CHECK_INSTALLERS = ("import importlib.util, sys; "
                    "print(sys.prefix, [m for m in ('pip', 'setuptools', 'wheel', "
                    "'pkg_resources', '_distutils_hack') if importlib.util.find_spec(m)])")


@pytest.mark.parametrize("python", ["/opt/pyflannel/bin/python", "python3"])
def test_no_installers_left(box, python):
    result = images.run(box, python, "-c", CHECK_INSTALLERS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 1)[1] == "[]\n"


def test_no_build_leftovers(box):
    result = images.run(box, "/opt/pyflannel/bin/python", "-c",
                        "import json, os; print(json.dumps(os.listdir('/opt/pyflannel/bin'))); "
                        "print(os.path.exists('/src'))")
    assert result.returncode == 0, result.stderr
    bin_listing, src_exists = result.stdout.splitlines()
    assert not [name for name in json.loads(bin_listing)
                if name.startswith(("pip", "wheel", "activate", "Activate"))]
    assert src_exists == "False"


CHECK_RUNTIME_ONLY = (
    "import importlib.metadata as md, importlib.util as u, json, os; print(json.dumps(["
    "[m for m in ('flannel.daemon', 'flannel.ctl', 'flannel.cni.plugin') if u.find_spec(m)], "
    "[m for m in ('flannel.lab', 'flannel_lab') if u.find_spec(m)], "
    "sorted(d.metadata['Name'] for d in md.distributions() "
    "if d.metadata['Name'].startswith('pyflannel')), "
    "sorted(n for n in os.listdir('/opt/pyflannel/bin') if 'lab' in n)]))")


def test_the_image_carries_only_the_runtime_package(box):
    """What runs on a node, and nothing of the lab: neither the old ``flannel.lab`` nor the
    lab's own package and distribution, nor its command."""
    result = images.run(box, "/opt/pyflannel/bin/python", "-c", CHECK_RUNTIME_ONLY)
    assert result.returncode == 0, result.stderr
    runtime, lab, dists, lab_commands = json.loads(result.stdout)
    assert runtime == ["flannel.daemon", "flannel.ctl", "flannel.cni.plugin"]
    assert lab == []
    assert dists == ["pyflannel"]
    assert lab_commands == []


def test_tools_flanneld_runs_are_there(box):
    """ip and bridge, both iptables variants (the mode detection compares their rules), nft."""
    for command in (("ip", "-V"), ("bridge", "-V"), ("iptables-legacy", "--version"),
                    ("iptables-nft", "--version"), ("ip6tables-legacy", "--version"),
                    ("ip6tables-nft", "--version"), ("iptables-legacy-save", "--version"),
                    ("iptables-nft-save", "--version"), ("nft", "--version")):
        result = images.run(box, *command)
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"


# What flanneld and flannelctl do with each tool, in a namespace of the test's own: a rule
# with an xtables match and target in each iptables variant (the extension modules load),
# a table in nftables, the JSON listings of flannelctl bundle, and the plain iptables name
# (Debian's default, nft) for an extension backend's commands.
TOOL_WORK = {
    "iptables-legacy": (
        ("iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "10.244.0.0/16",
         "-m", "comment", "--comment", "flannel masq", "-j", "MASQUERADE", "--random-fully"),
        ("iptables-legacy-save", "-t", "nat"), "--comment \"flannel masq\" -j MASQUERADE"),
    "ip6tables-nft": (
        ("ip6tables-nft", "-A", "FORWARD", "-s", "fd00::/64", "-m", "conntrack",
         "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"),
        ("ip6tables-nft-save",), "--ctstate RELATED,ESTABLISHED -j ACCEPT"),
    "iptables": (
        ("iptables", "-A", "FORWARD", "-d", "10.244.0.0/16", "-j", "ACCEPT"),
        ("iptables-nft-save", "-t", "filter"), "-A FORWARD -d 10.244.0.0/16 -j ACCEPT"),
    "nft": (
        ("nft", "add", "table", "ip", "flannel-ipv4"), ("nft", "list", "ruleset"),
        "table ip flannel-ipv4 {"),
    "ip": (("ip", "link", "add", "flannel.1", "type", "vxlan", "id", "1", "dstport", "8472"),
           ("ip", "-j", "-d", "link", "show"), '"ifname":"flannel.1"'),
    "bridge": (("ip", "link", "add", "cni0", "type", "bridge"),
               ("bridge", "-j", "fdb", "show", "br", "cni0"), '"ifname":"cni0"'),
}


@pytest.mark.parametrize("tool", TOOL_WORK)
def test_tools_do_flanneld_s_work(box, ns, tool):
    change, listing, expected = TOOL_WORK[tool]
    result = images.run(box, *change, netns=ns, cap_add=("CAP_NET_ADMIN", "CAP_NET_RAW"))
    assert result.returncode == 0, f"{' '.join(change)}: {result.stderr}"
    result = images.run(box, *listing, netns=ns, cap_add=("CAP_NET_ADMIN", "CAP_NET_RAW"))
    assert result.returncode == 0, f"{' '.join(listing)}: {result.stderr}"
    assert expected in result.stdout, result.stdout


# The Debian base's own tools and data, which the final stage leaves out: nothing runs them.
NOT_IN_THE_IMAGE = ("/usr/bin/apt-get", "/usr/bin/dpkg", "/usr/bin/perl", "/bin/bash",
                    "/usr/sbin/tc", "/usr/bin/ss", "/usr/lib/{multiarch}/gconv",
                    "/usr/lib/{multiarch}/perl-base", "/var/lib/dpkg/info", "/etc/apt",
                    "/usr/share/zoneinfo")


def test_the_image_is_only_what_runs(box):
    """Distroless: the base's package manager, bash, perl, the iproute2 tools flanneld never
    runs, glibc's gconv and the timezone data are not there; dpkg status entries (which
    scanners read) name the packages the runtime, the tools, libc and the CA bundle came
    from, and none of the base's that gave no file."""
    result = images.run(box, "python", "-c",
                        "import json, os, sys, sysconfig; "
                        "arch = sysconfig.get_config_var('MULTIARCH'); print(json.dumps("
                        "[[p for p in sys.argv[1:] if os.path.lexists(p.format(multiarch=arch))], "
                        "sorted(os.listdir('/var/lib/dpkg/status.d'))]))",
                        *NOT_IN_THE_IMAGE)
    assert result.returncode == 0, result.stderr
    present, packages = json.loads(result.stdout)
    assert present == []
    assert {"libpython3.11-stdlib", "python3.11-minimal", "iproute2", "iptables", "nftables",
            "libc6", "ca-certificates", "dash", "coreutils"} <= set(packages), packages
    assert not {"apt", "perl-base", "bash", "dpkg"} & set(packages), packages


def test_python_trusts_the_system_certificates(box):
    result = images.run(box, "python", "-c",
                        "import json, ssl; "
                        "print(json.dumps(ssl.create_default_context().cert_store_stats()))")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["x509_ca"] > 100, result.stdout


def test_what_flanneld_loads_starts_from_bytecode(box):
    """On a read-only root filesystem nothing could be cached: every module the package
    loads or imports anywhere (a store's client included), standard library included, must
    come from bytecode shipped in the image. python -v names the file each module's code
    came from; -B writes nothing."""
    result = images.run(box, "python", "-B", "-v", "/deploy/write-bytecode.py",
                        volumes=((ROOT / "deploy", "/deploy"),))
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = re.findall(r"^# code object from '?([^'\n]+)'?$", result.stderr, re.MULTILINE)
    assert len(loaded) > 300, result.stderr[-3000:]
    compiled = [path for path in loaded
                if not path.endswith(".pyc") and path != "/deploy/write-bytecode.py"]
    assert compiled == [], f"compiled at start, no bytecode in the image: {compiled}"


def test_size(image, tmp_path):
    """The whole image stays under the target; every layer's size is reported."""
    layers = images.layer_sizes(image, tmp_path / "image")
    size = sum(layer for _, layer in layers)
    print(f"\nimage size: {size / 1e6:.1f} MB uncompressed ({size} bytes, "
          f"target {SIZE_TARGET / 1e6:.0f} MB)")
    for step, layer in layers:
        print(f"  {layer / 1e6:6.1f} MB  {' '.join(step.split())[:100]}")
    assert size < SIZE_TARGET, (
        f"the image is {size / 1e6:.1f} MB uncompressed, target {SIZE_TARGET / 1e6:.0f} MB")


# Run by the image's python: the ipsec backend's own search and start of charon (flanneld's
# strongswan.conf, kernel-libipsec asked for), then VICI through the image's vici package.
CHARON_IN_THE_IMAGE = """
import json, os, subprocess
from flannel.ipsec.charon import Charon, CharonSpec, find_charon, stop

def plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value

charon = Charon(CharonSpec(libipsec=True))
try:
    charon.ensure()
    with charon.session() as vici:
        answers = {"version": vici.version(), "plugins": vici.stats()["plugins"],
                   "algorithms": vici.get_algorithms()}
    listing = subprocess.run(["swanctl", "--list-sas"], capture_output=True, timeout=30)
    answers["swanctl"] = listing.returncode
finally:
    stopped = charon.pid is not None and stop(charon.pid)
    status = os.waitstatus_to_exitcode(os.waitpid(charon.pid, 0)[1]) if stopped else None
print(json.dumps({"binary": find_charon(), "stopped": stopped, "status": status,
                  **plain(answers)}))
"""
# What the backend asks of charon: Go's IKE proposal (aes256-sha256-modp4096) and default ESP
# proposal (aes128gcm16-sha256-prfsha256-ecp256), by the names VICI gives them.
ALGORITHMS = {"encryption": "AES_CBC", "integrity": "HMAC_SHA2_256_128",
              "prf": "PRF_HMAC_SHA2_256", "aead": "AES_GCM_16", "dh": "MODP_4096"}


def test_charon_starts_from_the_image_and_answers_vici(box, ns, tmp_path):
    """The ipsec backend finds charon where Go flannel looks, starts it with flanneld's
    strongswan.conf in a namespace of the test's own (its run directory a private one), with
    the VICI plugin, the kernel's IPsec and kernel-libipsec's userspace ESP (a TUN device)
    loaded and the crypto of Go's proposals, and swanctl lists its SAs; then stops it: charon
    exits cleanly, leaving nothing running."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = images.run(box, "/opt/pyflannel/bin/python", "-c", CHARON_IN_THE_IMAGE, netns=ns,
                        volumes=((run_dir, "/run"), (Path("/dev/net/tun"), "/dev/net/tun")),
                        cap_add=("CAP_NET_ADMIN", "CAP_NET_RAW"))
    charon_log = run_dir / "flannel" / "ipsec" / "charon.log"
    tail = charon_log.read_text()[-3000:] if charon_log.exists() else "(no charon log)"
    assert result.returncode == 0, f"{result.stderr[-3000:]}\ncharon's log: {tail}"
    answer = json.loads(result.stdout)
    assert answer["binary"] == "/usr/lib/ipsec/charon"
    assert answer["version"]["daemon"] == "charon", answer["version"]
    assert answer["swanctl"] == 0, "swanctl --list-sas failed in the image"
    # Stopped by SIGTERM, it exits cleanly (an abort would leave its TUN device and SAs).
    assert (answer["stopped"], answer["status"]) == (True, 0), tail
    needed = {"kernel-netlink", "kernel-libipsec", "socket-default", "vici", "openssl",
              "nonce", "random"}
    assert needed <= set(answer["plugins"]), f"{answer['plugins']}\ncharon's log: {tail}"
    algorithms = answer["algorithms"]
    missing = {kind: name for kind, name in ALGORITHMS.items()
               if name not in algorithms.get(kind, {})}
    assert missing == {}, algorithms
    assert "ECP_256" in algorithms["dh"], algorithms
    left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                          timeout=30).stdout.split()
    assert left == [], f"processes left in the namespace: {left}"


def _charons_in(ns: str) -> list[int]:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                          timeout=30).stdout.split()
    found = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "charon":
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_flanneld_with_the_ipsec_backend_starts_the_image_s_charon(box, ns, tmp_path):
    """flanneld as the DaemonSet runs it (its capabilities, /run/flannel from the host) with
    the ipsec backend, here given /dev/net/tun (this kernel has no ESP): it finds and starts
    the image's charon, writes subnet.env with the MTU of ESP in UDP and becomes ready.
    charon outlives flanneld by design; the test stops it."""
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "eth0", netns=ns)
    netns.ip("link", "set", "eth0", "up", netns=ns)
    netns.ip("link", "set", "eth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", netns=ns)
    run_flannel = tmp_path / "run-flannel"
    run_flannel.mkdir()
    log = tmp_path / "flanneld.log"
    with EtcdServer(tmp_path / "etcd", netns=ns) as etcd:
        etcd.ctl("put", "/coreos.com/network/config", json.dumps(
            {"Network": "10.12.0.0/16", "Backend": {"Type": "ipsec", "PSK": "k" * 96}}))
        flanneld = images.start(
            box, "/opt/bin/flanneld", f"--etcd-endpoints={etcd.endpoint}", log=log, netns=ns,
            cap_add=("CAP_NET_ADMIN", "CAP_NET_RAW"),
            volumes=((run_flannel, "/run/flannel"), (Path("/dev/net/tun"), "/dev/net/tun")))
        try:
            subnet_env = run_flannel / "subnet.env"
            try:
                wait_until(subnet_env.exists, 60, interval=0.2, what=str(subnet_env))
            except AssertionError as err:
                raise AssertionError(f"{err}; flanneld's log:\n"
                                     f"{log.read_text(errors='replace')[-3000:]}") from None
            wait_until(lambda: "Ready: " in log.read_text(errors="replace"), 30,
                       interval=0.2, what="flanneld to be ready")
            text = log.read_text(errors="replace")
            assert "charon started" in text, text[-3000:]
            assert "Traceback" not in text, text[-3000:]
            # 1500 less ESP's 77 and UDP's 8 (kernel-libipsec sends ESP in UDP only) is 1415,
            # more than the 1400 its ipsec0 carries: pods get ipsec0's.
            assert "FLANNEL_MTU=1400\n" in subnet_env.read_text()
            assert _charons_in(ns), "no charon runs in the namespace"
        finally:
            flanneld.terminate()
            try:
                flanneld.wait(timeout=15)
            except subprocess.TimeoutExpired:
                flanneld.kill()
                flanneld.wait(timeout=15)
            for pid in _charons_in(ns):
                os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not _charons_in(ns), 15, interval=0.1, what="charon to stop")
