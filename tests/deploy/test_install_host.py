"""deploy/install-host.sh on a plain Debian bookworm host: a chroot made from the cached
debootstrap rootfs (python3, python3-venv, no systemd), so nothing touches this machine's
/opt, /etc or systemd. The chroot runs in its own mount namespace, so its /proc mount ends
with the process.

Marked slow, not image: it builds no image, so it runs on a worker of its own beside the image
build instead of queueing behind it in the image tests' worker group."""

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from flannel.version import __version__
from tests.deploy.rootfs import HOST, ensure_base_tarball, extract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SCRIPT = "/src/deploy/install-host.sh"


@pytest.fixture
def host(tmp_path):
    """A fresh plain host: the rootfs, this source tree at /src, and this machine's DNS and
    CA bundle (a TLS-inspecting proxy, if any, must be trusted to reach the package index)."""
    if shutil.which("debootstrap") is None:
        pytest.fail("debootstrap is not installed: run ./install.sh")
    root = tmp_path / "root"
    extract(ensure_base_tarball(HOST), root)
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "flannel", source / "flannel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "deploy", source / "deploy")
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf", follow_symlinks=True)
    if HOST_CA_BUNDLE.exists():
        shutil.copy2(HOST_CA_BUNDLE, source / "host-ca.pem")
    return root


CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "HOME": "/root", "LANG": "C.UTF-8"}


def chroot(root: Path, *command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--mount", "--propagation", "private",
                           f"--mount-proc={root / 'proc'}", "chroot", str(root), *command],
                          capture_output=True, text=True, timeout=timeout, env=CHROOT_ENV)


def install(root: Path, *extra: str) -> subprocess.CompletedProcess:
    ca = ("--ca-bundle", "/src/host-ca.pem") if (root / "src" / "host-ca.pem").exists() else ()
    return chroot(root, "bash", SCRIPT, "--source-dir", "/src", *ca, *extra)


def inside(root: Path, path: str) -> Path:
    """``path`` as the chroot sees it, symlinks resolved within the chroot."""
    current = root
    for part in Path(path).relative_to("/").parts:
        current = current / part
        hops = 0
        while current.is_symlink():
            hops += 1
            assert hops < 10, f"symlink loop at {current}"
            target = os.readlink(current)
            current = (root / target.lstrip("/")) if target.startswith("/") \
                else current.parent / target
    return current


def unit_settings(root: Path) -> dict[str, str]:
    text = (root / "etc/systemd/system/flanneld.service").read_text()
    return dict(re.findall(r"^(ExecStart|EnvironmentFile)=(.*)$", text, re.MULTILINE))


def test_install_upgrade_rollback_uninstall(host):
    first = install(host)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "installed pyflannel" in first.stdout
    # The unit starts what exists, reading the settings file that exists.
    settings = unit_settings(host)
    assert settings == {"ExecStart": "/opt/pyflannel/bin/flanneld",
                        "EnvironmentFile": "/etc/default/flanneld"}
    assert os.access(inside(host, settings["ExecStart"]), os.X_OK)
    env_file = inside(host, settings["EnvironmentFile"])
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert "# FLANNELD_ETCD_ENDPOINTS=" in env_file.read_text()
    version = chroot(host, "/opt/pyflannel/bin/flanneld", "--version")
    assert (version.returncode, version.stderr) == (0, f"{__version__}\n")
    venv = host / "opt/pyflannel" / os.readlink(host / "opt/pyflannel/bin")
    assert not list(venv.parent.glob("lib/python3*/site-packages/pip"))
    assert not list(venv.parent.glob("lib/python3*/site-packages/setuptools"))

    # A second install is an upgrade: the env file is kept, the old version stays for rollback.
    env_file.write_text("FLANNELD_ETCD_ENDPOINTS=http://127.0.0.1:2379\n")
    first_bin = os.readlink(host / "opt/pyflannel/bin")
    second = install(host)
    assert second.returncode == 0, second.stderr[-3000:]
    second_bin = os.readlink(host / "opt/pyflannel/bin")
    assert second_bin != first_bin
    assert os.readlink(host / "opt/pyflannel/previous-bin") == first_bin
    assert env_file.read_text() == "FLANNELD_ETCD_ENDPOINTS=http://127.0.0.1:2379\n"

    back = chroot(host, "bash", SCRIPT, "--rollback")
    assert back.returncode == 0, back.stderr
    assert os.readlink(host / "opt/pyflannel/bin") == first_bin
    assert os.readlink(host / "opt/pyflannel/previous-bin") == second_bin
    assert chroot(host, "/opt/pyflannel/bin/flanneld", "--version").returncode == 0

    removed = chroot(host, "bash", SCRIPT, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert "kept /etc/default/flanneld" in removed.stdout
    assert not (host / "opt/pyflannel").exists()
    assert not (host / "etc/systemd/system/flanneld.service").exists()
    assert env_file.exists()
    purged = chroot(host, "bash", SCRIPT, "--uninstall", "--purge")
    assert purged.returncode == 0, purged.stderr
    assert not env_file.exists()


def test_refuses_a_prefix_it_did_not_make(host):
    (host / "opt/data").mkdir(parents=True)
    (host / "opt/data/keep").write_text("x")
    result = install(host, "--prefix", "/opt/data")
    assert result.returncode == 1
    assert result.stderr == ("install-host.sh: /opt/data exists and was not made by "
                             "install-host.sh: choose another --prefix\n")
    removed = chroot(host, "bash", SCRIPT, "--uninstall", "--prefix", "/opt/data")
    assert removed.returncode == 1
    assert (host / "opt/data/keep").exists()


def test_refuses_a_missing_python(host):
    result = install(host, "--python", "/usr/bin/python3.13")
    assert result.returncode == 1
    assert result.stderr == ("install-host.sh: /usr/bin/python3.13 not found: install Python "
                             "3.11 or newer with its venv module, or give one with --python\n")


def test_refuses_a_path_with_shell_characters(host):
    result = install(host, "--prefix", "/opt/x;touch /tmp/owned")
    assert result.returncode == 1
    assert "--prefix '/opt/x;touch /tmp/owned' must be an absolute path" in result.stderr
    assert not (host / "tmp/owned").exists()
