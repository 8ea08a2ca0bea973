"""What the vm lane runs inside the VM: ``python -m tests.vm.driver SHARED``
(``--calibrate``: only time the calibration, as the host does before the VM boots).

Reads ``SHARED/job.json`` (the pytest arguments, the host's calibration time, a slowness
factor if one was given, the trees the guest should run from the cached root), loads the
kernel modules the scenarios need, measures how much slower than the host this guest runs,
and runs pytest once, in this process, over the scenarios (tests/vm/report.py writes each
outcome to ``SHARED/results.json`` as it ends). ``SHARED/guest.json`` says what the guest
was: its kernel, each module's load, the mount each cached tree is served by, the factor,
its timings; it is written before pytest starts and again at the end.
Must not touch: the host (it runs in the VM; ``SHARED`` is the only directory it writes).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flannel.files.fileutil import write_atomic
from flannel_lab import slowness

#: Where tests/vm/report.py writes the outcomes (set here, read there).
REPORT_ENV = "FLANNEL_VM_REPORT"
#: Headroom over the measured ratio: the machine's load changes during a run.
HEADROOM = 2.0


def load_modules(names: list[str]) -> dict[str, str]:
    """Each module's ``modprobe`` result: "" when loaded, else what modprobe said."""
    out = {}
    for name in names:
        done = subprocess.run(["modprobe", name], capture_output=True, text=True,
                              timeout=600, check=False)
        out[name] = "" if done.returncode == 0 else (done.stderr.strip() or
                                                     f"exit {done.returncode}")[:300]
    return out


#: An ESP state with Go's default cipher (AES-GCM), added and deleted in a throwaway network
#: namespace: the kernel loads the crypto modules it needs on the first one. flanneld's own
#: probe of ESP (flannel/ipsec/xfrm.py) gives ``ip xfrm`` 10 s, less than that loading takes
#: under TCG; loaded beforehand, the probe answers at once.
ESP_WARMUP = ("xfrm", "state", "add", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp",
              "spi", "0x000000fe", "mode", "tunnel", "aead", "rfc4106(gcm(aes))",
              "0x" + "00" * 20, "128")


def warm_up_esp() -> str:
    """"" once the kernel has taken an AES-GCM ESP state; else what ``ip`` said."""
    netns = f"vmlane-esp-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=600)
    try:
        done = subprocess.run(["ip", "-n", netns, *ESP_WARMUP], capture_output=True,
                              text=True, timeout=600, check=False)
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False, timeout=600)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def calibrate() -> float:
    """Seconds this process takes to import flanneld's modules (most of what a lab waits
    for is interpreters doing that); the same code times it on both sides, before anything
    else is imported."""
    start = time.monotonic()
    import flannel.cli
    import flannel.daemon  # noqa: F401
    return time.monotonic() - start


def calibrate_here() -> float:
    """``calibrate()`` in a new interpreter, as the host times it."""
    done = subprocess.run([sys.executable, "-m", "tests.vm.driver", "--calibrate"],
                          capture_output=True, text=True, check=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    return float(done.stdout)


def _unescape(field: str) -> str:
    """A path as /proc/self/mounts writes it (space, tab, newline, backslash as octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def mounts_of(paths: list[str]) -> dict[str, str]:
    """For each of ``paths``, what is mounted on it last (what the guest sees there):
    "SOURCE FSTYPE OPTIONS"; "" when nothing is."""
    top = dict.fromkeys(paths, "")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and (point := _unescape(fields[1])) in top:
            top[point] = " ".join((_unescape(fields[0]), fields[2], fields[3]))
    return top


def measured_factor(host_seconds: float, guest_seconds: float) -> float:
    """The slowness factor from the calibration's time on both sides: their ratio with
    headroom, rounded up, from 1 to the lab's maximum."""
    ratio = guest_seconds / max(host_seconds, 1e-3)
    return float(min(slowness.MAX_FACTOR, max(1, math.ceil(ratio * HEADROOM))))


def main(shared: Path) -> int:
    started = time.monotonic()
    job: dict[str, Any] = json.loads((shared / "job.json").read_text())
    guest: dict[str, Any] = {"kernel": platform.release(), "pid": os.getpid()}

    def save() -> None:
        write_atomic(shared / "guest.json", json.dumps(guest, indent=1).encode(), 0o644)

    guest["modules"] = load_modules(job["modules"])
    guest["esp_warmup"] = warm_up_esp()
    guest["modules_seconds"] = round(time.monotonic() - started, 1)
    guest["mounts"] = mounts_of(job["cached_trees"])
    # Timed the second time, as on the host: the first fetches the files into the guest's
    # cache, where they stay for the interpreters the scenarios start.
    guest["calibration_cold_seconds"] = round(calibrate_here(), 2)
    guest["calibration_seconds"] = round(calibrate_here(), 2)
    given = job.get("slowness")
    factor = float(given) if given else measured_factor(job["host_calibration_seconds"],
                                                          guest["calibration_seconds"])
    os.environ[slowness.ENV] = f"{factor:g}"
    guest["slowness"] = {"factor": factor, "given": bool(given)}
    os.environ[REPORT_ENV] = str(shared / "results.json")
    save()
    import pytest

    pytest_started = time.monotonic()
    code = pytest.main([*job["pytest"], "-p", "tests.vm.report",
                        f"--timeout={180 * factor:.0f}"])
    guest["pytest_exit"] = int(code)
    guest["pytest_seconds"] = round(time.monotonic() - pytest_started, 1)
    guest["seconds"] = round(time.monotonic() - started, 1)
    save()
    return int(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--calibrate"]:
        print(f"{calibrate():.4f}")
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1])))
