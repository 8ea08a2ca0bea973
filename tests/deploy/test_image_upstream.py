"""Go flannel's image swapped for ours, nothing else changed: every command that upstream's
v0.28.9 manifest, Helm chart, documentation and functional tests run in the flannel image runs
in ours with the same arguments, environment and mounts, and does its job.

The commands below are facts read from flannel-io/flannel at tag v0.28.9 (each names its
file); the test runs them inside the built image (buildah, chroot isolation). Whatever
flanneld does to a network happens in a network namespace of the test's own, and every
long-running command runs in one, whose removal stops all that runs there.
"""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from flannel.version import __version__
from flannel_lab.etcd import EtcdServer
from tests.deploy import images
from tests.deploy.manifests import BASE, documents
from tests.support import netns
from tests.support.tls import make_tls_files
from tests.support.tlscerts import make_pki
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]

# images/Dockerfile: the final stage's ENTRYPOINT, and no CMD.
ENTRYPOINT = ["/opt/bin/flanneld"]

# The init container that installs the CNI config: Documentation/kube-flannel.yml and
# chart/kube-flannel/templates/daemonset.yaml (unless flannel.skipCNIConfigInstallation) run
# install-conf; Documentation/kustomization/kube-flannel/kube-flannel.yml runs cp. Both
# mount the ConfigMap kube-flannel-cfg at /etc/kube-flannel/ and the host's CNI config
# directory at /etc/cni/net.d.
CONF_SRC, CONF_DEST = "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"
CONFLIST_INSTALLS = {
    "Documentation/kube-flannel.yml": ("/opt/bin/install-conf", CONF_SRC, CONF_DEST),
    "chart/kube-flannel/templates/daemonset.yaml": ("/opt/bin/install-conf", CONF_SRC,
                                                    CONF_DEST),
    "Documentation/kustomization/kube-flannel/kube-flannel.yml": ("cp", "-f", CONF_SRC,
                                                                  CONF_DEST),
}
# Documentation/minikube.yml's install-cni container (same mounts) copies it with a shell and
# then stays up.
MINIKUBE_INSTALL_CNI = ("/bin/sh", "-c", "set -e -x; cat /etc/kube-flannel/cni-conf.json; "
                        "cp -f /etc/kube-flannel/cni-conf.json /etc/cni/net.d/10-flannel.conf; "
                        "while true; do sleep 3600; done")

# The kube-flannel container's command and args. The chart's come from values.yaml
# (flannel.args, flannel.healthz.port: 8081), as chart/kube-flannel/tests/daemonset_test.yaml
# asserts them, with the health server on and off.
KUBE_ARGS = ("--ip-masq", "--kube-subnet-mgr")
FLANNELD_KUBE = {
    "Documentation/kube-flannel.yml": ("/opt/bin/flanneld", *KUBE_ARGS, "--healthz-port=8081"),
    "chart/kube-flannel (default values)": ("/opt/bin/flanneld", *KUBE_ARGS,
                                            "--healthz-port=8081"),
    "chart/kube-flannel (flannel.healthz.port: 0)": ("/opt/bin/flanneld", *KUBE_ARGS),
    "Documentation/kustomization/kube-flannel/kube-flannel.yml": ("/opt/bin/flanneld",
                                                                  *KUBE_ARGS),
    "Documentation/minikube.yml": ("/opt/bin/flanneld", *KUBE_ARGS),
}
# The container's env in the manifest and the chart (POD_NAME and POD_NAMESPACE from the
# downward API); its mounts: /run/flannel (hostPath), /etc/kube-flannel/ (the ConfigMap),
# /run/xtables.lock (hostPath, FileOrCreate); the kubelet adds the service account.
POD_NAME, POD_NAMESPACE = "kube-flannel-ds-x7k2p", "kube-flannel"
KUBE_ENV = {"POD_NAME": POD_NAME, "POD_NAMESPACE": POD_NAMESPACE,
            "EVENT_QUEUE_DEPTH": "5000", "CONT_WHEN_CACHE_NOT_READY": "false"}
# Where the kubelet mounts the service account, /var/run/secrets/kubernetes.io/serviceaccount,
# named through the image's /var/run -> /run link: buildah's chroot isolation would resolve
# that link on the host, not in the image.
SERVICE_ACCOUNT = "/run/secrets/kubernetes.io/serviceaccount"
# The container's securityContext: privileged: false, capabilities.add NET_ADMIN, NET_RAW.
KUBE_CAPABILITIES = ("CAP_NET_ADMIN", "CAP_NET_RAW")

# dist/functional-test.sh: flanneld in the flannel image (docker run --privileged) against a
# TLS etcd ({endpoint} is the test's). The container runs the entrypoint with these args
# (network at the default prefix, subnet.env at the default path); a second daemon is
# started in it by docker exec, for a network under another prefix.
ETCD_TLS_ARGS = ("--etcd-cafile=/certs/ca.pem", "--etcd-certfile=/certs/client.pem",
                 "--etcd-keyfile=/certs/client-key.pem", "--etcd-endpoints={endpoint}")
FLANNELD_ETCD = {
    "dist/functional-test.sh, docker run": (
        "/coreos.com/network", "/run/flannel/subnet.env", (*ETCD_TLS_ARGS, "-v", "10")),
    "dist/functional-test.sh, docker exec": (
        "/vxlan/network", "/vxlan.env",
        ("/opt/bin/flanneld", "-v", "10", "-subnet-file", "/vxlan.env",
         "-etcd-prefix=/vxlan/network", *ETCD_TLS_ARGS)),
}
ETCD_CONFIG = {"Network": "10.11.0.0/16", "Backend": {"Type": "vxlan"}}

# images/Dockerfile copies dist/mk-docker-opts.sh to /opt/bin; its flags are in its usage.
MK_DOCKER_OPTS = "/opt/bin/mk-docker-opts.sh"

# What else images/Dockerfile's final stage (alpine) puts on PATH: wireguard-tools, strongSwan's
# ipsec starter (ours has charon and swanctl only), kubernetes-sigs' iptables-wrapper (as
# /usr/sbin/iptables-wrapper, installed as iptables), busybox. Ours has none of them
# (docs/install.md lists them).
UPSTREAM_ONLY = {"wg": "wireguard-tools", "ipsec": "strongSwan's ipsec starter",
                 "iptables-wrapper": "iptables-wrapper", "busybox": "alpine's busybox"}


def configmap(directory: Path, data: dict[str, str]) -> Path:
    """A ConfigMap volume as the kubelet lays it out: each key a symlink into ..data."""
    payload = directory / "..2026_11_26_00_00_00.000000001"
    payload.mkdir(parents=True)
    for key, text in data.items():
        (payload / key).write_text(text)
        (directory / key).symlink_to(f"..data/{key}")
    (directory / "..data").symlink_to(payload.name)
    return directory


def our_configmap() -> dict[str, str]:
    return documents(BASE)["ConfigMap/kube-flannel-cfg"]["data"]


def underlay(ns: str) -> None:
    """The node's interface in the test's namespace: an address and a default route."""
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "eth0", netns=ns)
    netns.ip("link", "set", "eth0", "up", netns=ns)
    netns.ip("link", "set", "eth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", netns=ns)


def wait_logged(condition: Callable[[], object], log: Path, timeout: float, what: str) -> None:
    """Wait for ``condition``; a timeout shows the end of the process's ``log``."""
    try:
        wait_until(condition, timeout, interval=0.2, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}; its log:\n{log.read_text(errors='replace')[-3000:]}"
                             ) from None


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def test_the_entrypoint_is_upstreams_and_runs_flanneld(image, box):
    """A pod that gives only ``args:`` runs flanneld with them, as with upstream's image."""
    config = images.inspect(image)["OCIv1"]["config"]
    assert config.get("Entrypoint") == ENTRYPOINT
    assert not config.get("Cmd")
    result = images.run(box, *config["Entrypoint"], "--version")
    assert (result.returncode, result.stderr) == (0, f"{__version__}\n")


def test_upstreams_paths_are_links_to_our_commands(box):
    """Each needs the image's virtualenv: unlike upstream's static flanneld and shell
    script, none can be copied out of the image onto a host."""
    paths = ("/opt/bin/flanneld", "/opt/bin/install-conf", MK_DOCKER_OPTS)
    result = images.run(box, "python", "-c",
                        "import json, os, sys; "
                        "print(json.dumps({p: os.readlink(p) for p in sys.argv[1:]}))", *paths)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "/opt/bin/flanneld": "/opt/pyflannel/bin/flanneld",
        "/opt/bin/install-conf": "/opt/pyflannel/bin/install-conf",
        MK_DOCKER_OPTS: "/opt/pyflannel/bin/mk-docker-opts"}


@pytest.mark.parametrize("command", UPSTREAM_ONLY)
def test_what_upstreams_image_has_and_ours_has_not(box, command):
    """A difference the docs list: adding one to the image must update docs/install.md."""
    result = images.run(box, "python", "-c",
                        "import shutil, sys; print(shutil.which(sys.argv[1]))", command)
    assert (result.returncode, result.stdout) == (0, "None\n"), UPSTREAM_ONLY[command]


@pytest.mark.parametrize("where", CONFLIST_INSTALLS)
def test_the_init_container_installs_the_conflist(box, tmp_path, where):
    data = our_configmap()
    cfg = configmap(tmp_path / "flannel-cfg", data)
    netd = tmp_path / "net.d"
    netd.mkdir()
    (netd / "10-flannel.conflist").write_text('{"name": "an older one"}\n')
    result = images.run(box, *CONFLIST_INSTALLS[where],
                        volumes=((netd, "/etc/cni/net.d"), (cfg, "/etc/kube-flannel/")))
    assert (result.returncode, result.stderr) == (0, "")
    assert (netd / "10-flannel.conflist").read_text() == data["cni-conf.json"]
    assert [p.name for p in netd.iterdir()] == ["10-flannel.conflist"]


def test_minikubes_install_cni_container_copies_the_conf_and_stays_up(box, ns, tmp_path):
    """Run in a namespace of the test's own so that its end stops the shell's sleep too
    (stopping buildah run ends the shell, not its child)."""
    data = our_configmap()
    cfg = configmap(tmp_path / "flannel-cfg", data)
    netd = tmp_path / "net.d"
    netd.mkdir()
    log = tmp_path / "install-cni.log"
    process = images.start(box, *MINIKUBE_INSTALL_CNI, log=log, netns=ns,
                           volumes=((netd, "/etc/cni/net.d"), (cfg, "/etc/kube-flannel/")))
    try:
        conf = netd / "10-flannel.conf"
        wait_logged(lambda: conf.exists() and conf.read_text() == data["cni-conf.json"], log,
                    30, f"{conf} with the ConfigMap's cni-conf.json")
        assert process.poll() is None, log.read_text()
    finally:
        stop(process)


def test_install_conf_refuses_a_missing_source_naming_it(box, tmp_path):
    """An init container whose ConfigMap lacks the key fails, and says which file."""
    cfg = configmap(tmp_path / "flannel-cfg", {"net-conf.json": "{}"})
    netd = tmp_path / "net.d"
    netd.mkdir()
    result = images.run(box, *CONFLIST_INSTALLS["Documentation/kube-flannel.yml"],
                        volumes=((netd, "/etc/cni/net.d"), (cfg, "/etc/kube-flannel/")))
    assert result.returncode == 1
    assert result.stderr.startswith(f'error installing "{CONF_SRC}": cannot open it: No such '
                                    "file or directory"), result.stderr
    assert list(netd.iterdir()) == []


def kube_mounts(tmp_path: Path) -> tuple[tuple[Path, str], ...]:
    run_flannel = tmp_path / "run-flannel"
    run_flannel.mkdir()
    xtables_lock = tmp_path / "xtables.lock"
    xtables_lock.touch()
    return ((run_flannel, "/run/flannel"),
            (configmap(tmp_path / "flannel-cfg", our_configmap()), "/etc/kube-flannel/"),
            (xtables_lock, "/run/xtables.lock"))


@pytest.mark.parametrize("where", FLANNELD_KUBE)
def test_flanneld_takes_upstreams_kube_args_and_wants_only_a_cluster(box, ns, tmp_path,
                                                                    where):
    """Outside a pod (no service account), flanneld gets as far as the Kubernetes client
    and stops there, saying what is missing: every flag was accepted."""
    command = FLANNELD_KUBE[where]
    result = images.run(box, *command, volumes=kube_mounts(tmp_path), env=KUBE_ENV,
                        netns=ns, cap_add=KUBE_CAPABILITIES, timeout=60)
    assert result.returncode == 1, result.stderr
    assert ("cannot build the Kubernetes client config: not running in a cluster: give "
            "--kubeconfig-file or --kube-api-url") in result.stderr
    assert "Traceback" not in result.stderr
    if "--healthz-port=8081" in command:
        assert "health server listening on 0.0.0.0 port 8081" in result.stderr


def test_flanneld_as_upstreams_daemonset_runs_it_joins_the_cluster(box, ns, tmp_path):
    """The manifest's container as the kubelet starts it (its command, env and mounts, the
    service account, KUBERNETES_SERVICE_HOST/PORT) against the API server test double
    (tests/support/kubeapi.py, TLS and a bearer token): flanneld takes the node's pod CIDR,
    writes subnet.env, makes the vxlan device and answers /readyz on port 8081."""
    underlay(ns)
    pki = make_pki(tmp_path / "pki")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("upstream-daemonset-token")
    (account / "ca.crt").write_bytes(pki.ca.read_bytes())
    (account / "namespace").write_text(POD_NAMESPACE)
    api_log = tmp_path / "kubeapi.log"
    with api_log.open("wb") as out:
        api = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.support.kubeapi",
             "--node", "node1=10.244.1.0/24", "--pod", f"{POD_NAMESPACE}/{POD_NAME}=node1",
             "--token", "upstream-daemonset-token", "--tls-cert", str(pki.server_cert),
             "--tls-key", str(pki.server_key)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    flanneld = None
    try:
        listening = wait_until(lambda: [line for line in api_log.read_text().splitlines()
                                        if line.startswith("listening on ")], 30,
                               what="the API server double to listen")
        port = listening[0].rsplit(":", 1)[1]
        mounts = (*kube_mounts(tmp_path), (account, SERVICE_ACCOUNT))
        env = {**KUBE_ENV, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": port}
        log = tmp_path / "flanneld.log"
        flanneld = images.start(box, *FLANNELD_KUBE["Documentation/kube-flannel.yml"],
                                log=log, volumes=mounts, env=env, netns=ns,
                                cap_add=KUBE_CAPABILITIES)
        subnet_env = tmp_path / "run-flannel" / "subnet.env"
        wait_logged(subnet_env.exists, log, 60, str(subnet_env))
        assert "FLANNEL_SUBNET=10.244.1.1/24\n" in subnet_env.read_text()
        assert " vxlan id 1 " in netns.ip("-d", "link", "show", "flannel.1", netns=ns).stdout
        ready = ("import urllib.request; "
                 "print(urllib.request.urlopen('http://127.0.0.1:8081/readyz', timeout=5).status)")
        wait_until(lambda: subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", ready], capture_output=True,
            text=True, timeout=30).stdout == "200\n", 30, what="/readyz to answer 200")
        assert "Traceback" not in log.read_text(errors="replace")
    finally:
        if flanneld is not None:
            stop(flanneld)
        stop(api)


@pytest.mark.parametrize("where", FLANNELD_ETCD)
def test_flanneld_with_upstreams_functional_test_args_leases_from_etcd(image, box, ns,
                                                                      tmp_path, where):
    """Against a TLS etcd with client certificates: the Go flags (single-dash ones too) are
    taken and flanneld leases a subnet and writes the subnet file where it was told."""
    prefix, subnet_file, args = FLANNELD_ETCD[where]
    underlay(ns)
    tls = make_tls_files(tmp_path / "tls")
    certs = tmp_path / "certs"
    certs.mkdir()
    for name, source in (("ca.pem", tls.ca), ("client.pem", tls.client_cert),
                         ("client-key.pem", tls.client_key)):
        (certs / name).write_bytes(source.read_bytes())
    entrypoint = images.inspect(image)["OCIv1"]["config"]["Entrypoint"]
    with EtcdServer(tmp_path / "etcd", tls=tls, netns=ns) as etcd:
        etcd.ctl("put", f"{prefix}/config", json.dumps(ETCD_CONFIG))
        command = [arg.format(endpoint=etcd.endpoint) for arg in args]
        if not command[0].startswith("/"):
            command = [*entrypoint, *command]
        log = tmp_path / "flanneld.log"
        # /run is the run's own tmpfs: a host directory stands in for /run/flannel there.
        run_flannel = tmp_path / "run-flannel"
        run_flannel.mkdir()
        volumes = ((certs, "/certs"), (run_flannel, "/run/flannel"))
        flanneld = images.start(box, *command, log=log, netns=ns, cap_add=KUBE_CAPABILITIES,
                                volumes=volumes)
        try:
            wait_logged(lambda: f"Wrote {subnet_file}:" in log.read_text(errors="replace"),
                        log, 60, f"flanneld to write {subnet_file}")
            # Read inside the container, as upstream's test does (docker exec cat).
            result = images.run(box, "cat", subnet_file, volumes=volumes)
            assert result.returncode == 0, result.stderr
            text = result.stdout
            assert "FLANNEL_NETWORK=10.11.0.0/16\n" in text
            assert "FLANNEL_SUBNET=10.11." in text
            leases = etcd.ctl("get", "--prefix", "--keys-only", f"{prefix}/subnets/")
            assert leases.stdout.strip().startswith(f"{prefix}/subnets/10.11.")
        finally:
            stop(flanneld)


def test_mk_docker_opts_sh_writes_the_docker_options(box, ns, tmp_path):
    """As a host's docker unit runs it, -c and -k as in its usage; the routing table it
    checks is the test namespace's."""
    run_flannel = tmp_path / "run-flannel"
    run_flannel.mkdir()
    (run_flannel / "subnet.env").write_text(
        "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\n"
        "FLANNEL_IPMASQ=false\n")
    out = tmp_path / "out"
    out.mkdir()
    result = images.run(box, MK_DOCKER_OPTS, "-f", "/run/flannel/subnet.env",
                        "-d", "/out/docker_opts.env", "-c", "-k", "DOCKER_NETWORK_OPTIONS",
                        volumes=((run_flannel, "/run/flannel"), (out, "/out")), netns=ns)
    assert (result.returncode, result.stderr) == (0, "")
    assert (out / "docker_opts.env").read_text() == (
        'DOCKER_NETWORK_OPTIONS=" --bip=10.1.74.1/24 --ip-masq=true --mtu=1472"\n')
