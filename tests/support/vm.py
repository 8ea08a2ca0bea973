"""Booting Debian's own kernel over this machine's root file system, for the vm lane
(tests/vm) and the VM benchmark (bench/vm_throughput.py).

virtme-ng (``vng``, the test extra) starts qemu with a kernel from /boot and this host's root
file system shared read-only (9p): the guest runs this checkout with its virtualenv and the
host's tools (etcd, charon, wg, iperf3...), as root, with the kernel's own modules (ipip,
wireguard, esp4: what this host's kernel may lack). One directory of the host's is shared
writable; the guest's /tmp, /run and /var are its own, in its memory.

virtme-ng mounts the root over 9p without a cache (every open, stat and read a round trip to
qemu, tens of times the host's cost under TCG; its faster virtiofs needs a daemon this host
lacks), so the host's root is exported a second time, read-only, and the guest mounts that
with ``cache=loose`` and binds it over what it runs from (``CACHED_TREES``: /usr, the
interpreter's prefix, this checkout) before the command starts: the same paths, each file
fetched once per boot. The host must not change those trees while a VM runs (the guest would
not see it).

KVM is used when it boots: /dev/kvm served by a hypervisor that runs stock kernels
(kvm_intel or kvm_amd) and a bounded trial boot that answers; else qemu's TCG, several times
slower (``FLANNEL_VM_ACCEL=tcg|kvm`` decides instead). Every boot is bounded; on the bound
the VM's process group, which this module started, is killed.

API: ``missing_vm()`` (why no VM can boot here, as a skip reason; "" when one can),
``guest_kernel()``, ``choose_accel()``, ``boot(argv, shared, timeout)`` -> ``Boot``,
``calibration_seconds()`` (what the guest also times, to measure how much slower it runs),
``cached_trees()`` and ``guest_command(argv)`` (what the guest binds from the cached root).
Must not touch: anything but the directories it is given and the processes it starts.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VNG = str(Path(sys.executable).parent / "vng")
QEMU = "qemu-system-x86_64"
#: What the lane loads in the guest: the three backends' data paths, and what flanneld needs
#: to start at all (br_netfilter, as Go flannel: it refuses to start without it).
MODULES = ("ipip", "wireguard", "esp4", "xfrm_user", "br_netfilter")
MEMORY = "3G"
#: One vCPU per host core (this machine has 2): with the guest's files cached it is bound by
#: its emulated CPUs, and more vCPU threads than cores only take turns on them.
CPUS = 2
INSTALL = ("./install.sh installs what it needs: qemu-system-x86, linux-image-amd64 and "
           "busybox-static (Debian), virtme-ng (the test extra)")
KVM_TRIAL_SECONDS = 60.0
ACCEL_ENV = "FLANNEL_VM_ACCEL"


class VmError(Exception):
    """The VM could not be booted or gave no answer; the message says why."""


def _modules_of(release: str) -> set[str]:
    """Module names (``ipip``) the kernel ``release`` has, loadable or built in."""
    names = set()
    for index in ("modules.dep", "modules.builtin"):
        try:
            text = (Path("/lib/modules") / release / index).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            path = line.split(":", 1)[0]
            names.add(re.sub(r"\.ko(\.(xz|gz|zst))?$", "", path.rsplit("/", 1)[-1]))
    return names


def _release_key(release: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", release)]


@functools.cache
def guest_kernel() -> tuple[Path, str] | None:
    """The newest kernel image in /boot whose modules include every one of ``MODULES``:
    (image, release); None when there is none."""
    found = []
    for image in Path("/boot").glob("vmlinuz-*"):
        release = image.name.removeprefix("vmlinuz-")
        if set(MODULES) <= _modules_of(release):
            found.append((image, release))
    return max(found, key=lambda f: _release_key(f[1]), default=None)


@functools.cache
def missing_vm() -> str:
    """"" when this machine can boot the guest kernel; otherwise why not and what to install,
    in one line (a skip reason)."""
    if os.geteuid() != 0:
        return "the vm lane needs root (qemu shares the root file system as root sees it)"
    lacking = [what for what, ok in (
        ("virtme-ng (vng)", os.access(VNG, os.X_OK)),
        (QEMU, shutil.which(QEMU) is not None),
        ("busybox", shutil.which("busybox") is not None)) if not ok]
    if guest_kernel() is None:
        lacking.append(f"a kernel image in /boot with the {', '.join(MODULES)} modules")
    if lacking:
        return f"cannot boot a VM: no {', '.join(lacking)}; {INSTALL}"
    return ""


def _kvm_hypervisor() -> str:
    """Why KVM cannot boot a stock kernel here, or "" when it may."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        return f"/dev/kvm: {err.strerror}"
    os.close(fd)
    modules = {name for name in ("kvm_intel", "kvm_amd", "kvm_pvm")
               if Path("/sys/module", name).exists()}
    if modules == {"kvm_pvm"}:
        return ("/dev/kvm is PVM's (kvm_pvm), which boots only kernels built for it, not "
                "Debian's")
    return ""


#: The 9p mount tag of the cached export of the host's root, and where the guest mounts it.
CACHED_ROOT_TAG = "flannel-root"
CACHED_ROOT = "/run/flannel-vm-root"


def cached_trees() -> list[Path]:
    """What the guest reads from the cached export instead of virtme-ng's uncached root:
    /usr (every tool and library), the interpreter's prefix and this checkout (with its
    virtualenv); a tree inside another one listed is left out."""
    trees: list[Path] = []
    for tree in (Path("/usr"), Path(sys.base_prefix).resolve(), REPO):
        if not any(tree == t or t in tree.parents for t in trees):
            trees.append(tree)
    return trees


def guest_command(argv: list[str]) -> str:
    """The guest's shell command: the cached root mounted and bound over ``cached_trees()``,
    then ``argv`` (quoted); a mount that fails ends it there, with mount's message."""
    steps = [["mkdir", "-p", CACHED_ROOT],
             ["mount", "-t", "9p", "-o", "ro,trans=virtio,version=9p2000.L,access=any,"
              "msize=524288,cache=loose", CACHED_ROOT_TAG, CACHED_ROOT],
             *(["mount", "--bind", f"{CACHED_ROOT}{tree}", str(tree)]
               for tree in cached_trees()),
             # Into the bound checkout: the shell's directory is still the uncached one.
             ["cd", str(REPO)]]
    return " && ".join([*map(shlex.join, steps), f"exec {shlex.join(argv)}"])


def _vng_argv(argv: list[str], shared: Path, kvm: bool) -> list[str]:
    image, _release = guest_kernel() or (None, "")
    if image is None:
        raise VmError(missing_vm() or "no guest kernel")
    return [VNG, "--run", str(image), "--memory", MEMORY, "--cpus", str(CPUS),
            *([] if kvm else ["--disable-kvm"]),
            # Under TCG every page-table switch flushes qemu's software TLB: without the
            # kernel's page-table isolation a system call costs a fraction.
            "--append", "mitigations=off",
            # vng joins these with spaces: no value may hold one ("/" and the tag do not).
            f"--qemu-opts=-fsdev local,id=flannelroot,path=/,security_model=none,readonly=on,"
            f"multidevs=remap -device virtio-9p-pci,fsdev=flannelroot,"
            f"mount_tag={CACHED_ROOT_TAG}",
            "--rwdir", str(shared), "--cwd", str(REPO), "--", guest_command(argv)]


@dataclass
class Boot:
    """One VM run: its exit status (None: killed at its bound), the seconds it took, the
    accelerator and the console's output (the guest command's stdout and stderr)."""

    returncode: int | None
    seconds: float
    accel: str
    console: str


def boot(argv: list[str], shared: Path, timeout: float, accel: str | None = None,
         console: Path | None = None) -> Boot:
    """Run ``argv`` (no shell: quoted for the guest's) in a VM with ``shared`` writable at
    the same path; kill the VM after ``timeout`` seconds. The console goes to ``console``
    (default ``shared/console.log``) as it comes."""
    accel = accel or choose_accel(shared)
    console = console or shared / "console.log"
    scratch = shared / "vng-tmp"  # vng's own temporary files (its exit-code file)
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch),
           "PATH": f"{Path(VNG).parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}
    start = time.monotonic()
    with open(console, "wb") as out:
        proc = subprocess.Popen(_vng_argv(argv, shared, accel == "kvm"), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            _kill_session(proc)
    text = console.read_text(errors="replace")
    return Boot(code, time.monotonic() - start, accel, text)


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the process group ``proc`` leads (vng and its qemu)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


MARK = "flannel-vm-kvm-boots"


@functools.cache
def _kvm_trial(shared: Path) -> str:
    """"" when a KVM guest boots and answers within the bound, else why not."""
    trial = shared / "kvm-trial"
    trial.mkdir(exist_ok=True)
    result = boot(["echo", MARK], trial, KVM_TRIAL_SECONDS, accel="kvm")
    if result.returncode == 0 and MARK in result.console:
        return ""
    if result.returncode is None:
        return f"a KVM guest gave no answer within {KVM_TRIAL_SECONDS:g}s"
    last = result.console.strip().splitlines()[-1:] or ["no output"]
    return f"a KVM guest failed ({last[0][:200]})"


def choose_accel(shared: Path) -> str:
    """"kvm" or "tcg": ``FLANNEL_VM_ACCEL`` when set, else KVM when it boots a trial
    guest here (the reason it does not is recorded in ``shared/accel.txt``)."""
    given = os.environ.get(ACCEL_ENV, "").strip().lower()
    if given in ("kvm", "tcg"):
        return given
    if given:
        raise VmError(f"{ACCEL_ENV}={given[:20]!r}: give kvm, tcg, or nothing (KVM when a "
                      "trial guest boots)")
    why = _kvm_hypervisor() or _kvm_trial(shared)
    (shared / "accel.txt").write_text(f"tcg: {why}\n" if why else "kvm\n")
    return "tcg" if why else "kvm"


def calibration_seconds(rounds: int = 3) -> float:
    """The median time, here, of what the guest times to measure its slowness
    (``tests.vm.driver --calibrate``: importing flanneld's modules in a new interpreter)."""
    times = []
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-m", "tests.vm.driver", "--calibrate"],
                              capture_output=True, text=True, check=True, timeout=600,
                              cwd=REPO, stdin=subprocess.DEVNULL)
        times.append(float(done.stdout))
    return sorted(times)[len(times) // 2]
