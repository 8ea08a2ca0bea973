"""Benchmark: one TCP stream pod to pod through each backend's kernel data path, in one VM
booted with Debian's kernel (tests/support/vm.py), each as a ratio to kernel vxlan there.

The variants: kernel vxlan (the baseline), ipip, kernel WireGuard, ipsec on kernel ESP, and
wireguard-go (the guest's kernel has WireGuard, so the wireguard-go lab is built while the
module is not loaded and the kernel may load no module: after the vxlan lab, which loads
every other module a lab needs). Each is a two-node lab built by
flanneld with one pod per node; iperf3 runs from pod to pod. Rounds are interleaved across
the variants, every flanneld paused (SIGSTOP) while they run: the data paths are the
kernel's (and wireguard-go's), and the daemons' own work is not measured.

    .venv/bin/python -m bench.vm_throughput --rounds 3 --seconds 10

Prints each variant's median Gbit/s, its rounds and its ratio to vxlan, the host's and the
guest's load average, the accelerator (TCG is an emulated CPU: the figures compare the
variants with each other, not with a real machine's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

VARIANTS = {  # name -> (network config's Backend, needs kernel WireGuard absent)
    "kernel vxlan": ({"Type": "vxlan"}, False),
    "ipip": ({"Type": "ipip"}, False),
    "kernel wireguard": ({"Type": "wireguard"}, False),
    "ipsec (kernel ESP)": ({"Type": "ipsec", "PSK": "a" * 96}, False),
    "wireguard-go": ({"Type": "wireguard"}, True),
}
BASELINE = "kernel vxlan"
MODPROBE = Path("/proc/sys/kernel/modprobe")


class IperfError(Exception):
    """iperf3 measured nothing; the message is its own error."""


def iperf(client_ns: str, server: str, seconds: int) -> float:
    """Gbit/s of one TCP stream from ``client_ns`` to ``server`` for ``seconds``;
    IperfError with iperf3's words when it measured nothing."""
    done = subprocess.run(["ip", "netns", "exec", client_ns, "iperf3", "-J", "-c", server,
                           "-t", str(seconds)], capture_output=True, text=True,
                          timeout=seconds * 20 + 120, check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {}
    try:
        return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e9
    except (KeyError, TypeError):
        said = doc.get("error") if isinstance(doc, dict) else None
        raise IperfError(f"iperf3 to {server} (exit {done.returncode}): "
                         f"{said or done.stderr.strip()[-300:] or done.stdout[-300:]}"
                         ) from None


def build_variant(name: str, root: Path, number: int) -> Any:
    from flannel_lab.cli import build, wait_for_mesh
    from flannel_lab.cluster import Lab

    backend, _ = VARIANTS[name]
    lab = Lab(f"vmb{number}", root=root)
    # As kube-flannel runs it: without --ip-masq the CNI bridge plugin masquerades pod traffic
    # leaving by the default route, ipsec's way out, and it no longer matches the XFRM policies.
    build(lab, 2, {"Network": "10.244.0.0/16", "Backend": backend}, flanneld_args=("--ip-masq",))
    wait_for_mesh(lab, [1, 2], ipv6=False, timeout=60)
    for index in (1, 2):
        lab.add_pod(index)
    return lab


def guest(shared: Path) -> None:
    """In the VM: build every variant's lab, run the interleaved rounds, write results."""
    job = json.loads((shared / "job.json").read_text())
    root = Path(tempfile.mkdtemp(prefix="vmbench", dir="/run"))
    from tests.vm.driver import warm_up_esp

    for module in ("ipip", "esp4", "xfrm_user", "br_netfilter", "tun", "vxlan"):
        subprocess.run(["modprobe", module], check=True, timeout=600)
    if why := warm_up_esp():
        raise RuntimeError(f"the kernel takes no AES-GCM ESP state: {why}")
    os.environ.setdefault("FLANNEL_LAB_SLOWNESS", str(job["slowness"]))
    labs: dict[str, Any] = {}
    servers: list[subprocess.Popen[bytes]] = []
    with ExitStack() as cleanup:
        cleanup.callback(lambda: [lab.down() for lab in labs.values()])
        cleanup.callback(lambda: [(s.kill(), s.wait()) for s in servers])
        # vxlan first (its lab loads the modules every lab needs: veth, bridge, netfilter),
        # then wireguard-go, while the kernel may load none (it would load WireGuard when
        # flanneld asks for it), then the others.
        order = [BASELINE, *sorted(VARIANTS, key=lambda n: not VARIANTS[n][1])]
        order = list(dict.fromkeys(order))
        for number, name in enumerate(order, 1):
            if VARIANTS[name][1]:
                saved = MODPROBE.read_text()
                MODPROBE.write_text("/bin/true\n")
                try:
                    labs[name] = build_variant(name, root, number)
                finally:
                    MODPROBE.write_text(saved)
                subprocess.run(["modprobe", "wireguard"], check=True, timeout=600)
            else:
                labs[name] = build_variant(name, root, number)
            pods = [p for p in labs[name].state.pods]
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", pods[1].netns, "iperf3", "-s"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # Each variant on the data path it names, as its flanneld logged it.
        paths = {name: lab.log(1) for name, lab in labs.items()}
        for name, said in (("kernel wireguard", "using kernel WireGuard"),
                           ("wireguard-go", "using wireguard-go"),
                           ("ipsec (kernel ESP)", "(ESP in the kernel)")):
            if said not in paths[name]:
                raise RuntimeError(f"{name}: its flanneld did not log {said!r}")
        for lab in labs.values():
            for node in lab.state.nodes:
                os.kill(node.pid, signal.SIGSTOP)
                cleanup.callback(os.kill, node.pid, signal.SIGCONT)
        time.sleep(1)  # iperf3 -s has no readiness signal; a failed connect raises below
        results: dict[str, list[float]] = {name: [] for name in labs}
        failures: dict[str, list[str]] = {name: [] for name in labs}
        loads = []
        for _ in range(job["rounds"]):
            loads.append(os.getloadavg()[0])
            for name, lab in labs.items():
                client, server = lab.state.pods[0], lab.state.pods[1]
                try:
                    results[name].append(iperf(client.netns, server.address,
                                               job["seconds"]))
                except IperfError as err:  # the round is lost, said, not the others
                    failures[name].append(str(err))
        (shared / "results.json").write_text(json.dumps(
            {"gbits": results, "failures": failures, "guest_load": loads,
             "kernel": os.uname().release}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--guest", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.guest:
        guest(args.guest)
        return
    from tests.support import vm

    if reason := vm.missing_vm():
        sys.exit(f"bench.vm_throughput: {reason}")
    shared = Path(tempfile.mkdtemp(prefix="vmbench", dir="/tmp"))
    host_load = [os.getloadavg()]
    started = time.monotonic()
    # Patience for the lab's waits in an emulated guest (tests/vm/driver.py measures it).
    (shared / "job.json").write_text(json.dumps({"rounds": args.rounds,
                                                 "seconds": args.seconds, "slowness": 100}))
    boot = vm.boot([sys.executable, "-m", "bench.vm_throughput", "--guest", str(shared)],
                   shared, 3 * 3600)
    host_load.append(os.getloadavg())
    try:
        found = json.loads((shared / "results.json").read_text())
    except (OSError, ValueError):
        sys.exit(f"bench.vm_throughput: the guest wrote no results ({boot.accel}, exit "
                 f"{boot.returncode}); its console: {shared / 'console.log'}")
    for name, said in found["failures"].items():
        for text in said:
            print(f"{name}: a round measured nothing: {text}")
    if not found["gbits"][BASELINE]:
        sys.exit(f"bench.vm_throughput: no round of {BASELINE}, the baseline, measured")
    base = statistics.median(found["gbits"][BASELINE])
    print(f"guest kernel {found['kernel']}, {boot.accel}, {boot.seconds:.0f}s in the VM; "
          f"host load average before/after {host_load}; guest load average before each "
          f"round {[round(x, 2) for x in found['guest_load']]}")
    for name, rounds in found["gbits"].items():
        if not rounds:
            continue
        figure = statistics.median(rounds)
        print(f"{name}: {figure:.3f} Gbit/s (rounds {[round(x, 3) for x in rounds]}), "
              f"ratio to {BASELINE} {figure / base:.3f}")
    print(f"total {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
