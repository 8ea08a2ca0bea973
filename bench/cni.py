"""Benchmark: the flannel CNI plugin's own cost per pod ADD and DEL.

In a network namespace, N pods are added and deleted through the installed ``flannel``
launcher (which delegates to Debian's ``bridge`` + ``host-local``), and N more directly
through ``bridge`` with the same delegate config (the baseline, same run). The figure is the
plugin's added milliseconds: p50(plugin) - p50(bridge), for ADD and for DEL.

    .venv/bin/python -m bench.cni --pods 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from flannel.cni.install import install_plugin

CNI_DIR = "/usr/lib/cni"
ENV = "FLANNEL_NETWORK=10.78.0.0/16\nFLANNEL_SUBNET=10.78.1.1/24\nFLANNEL_MTU=1450\n" \
      "FLANNEL_IPMASQ=true\n"


def netns(*args: str) -> None:
    subprocess.run(["ip", "netns", *args], check=True, capture_output=True)


def invoke(host_ns: str, executable: str, command: str, pod: str, conf: bytes,
           bin_dir: str) -> float:
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": command, "CNI_CONTAINERID": pod,
           "CNI_NETNS": f"/run/netns/{pod}", "CNI_IFNAME": "eth0",
           "CNI_PATH": f"{bin_dir}:{CNI_DIR}"}
    start = time.perf_counter()
    proc = subprocess.run(["ip", "netns", "exec", host_ns, executable], input=conf, env=env,
                          capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{executable} {command}: {proc.stdout.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    args = parser.parse_args()
    tag = f"flcni{os.getpid() % 100000}"
    host_ns = f"{tag}h"
    pods = [f"{tag}p{i}" for i in range(args.pods)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plugin = str(install_plugin(work / "bin"))
        (work / "subnet.env").write_text(ENV)
        conf = {"cniVersion": "1.0.0", "name": "bench", "type": "flannel",
                "subnetFile": str(work / "subnet.env"), "dataDir": str(work / "data"),
                "ipam": {"dataDir": str(work / "ipam")}}
        flannel_conf = json.dumps(conf).encode()
        delegate_conf = json.dumps({
            "cniVersion": "1.0.0", "name": "bench", "type": "bridge", "isGateway": True,
            "ipMasq": False, "mtu": 1450,
            "ipam": {"type": "host-local", "dataDir": str(work / "ipam2"),
                     "ranges": [[{"subnet": "10.78.1.0/24"}]],
                     "routes": [{"dst": "10.78.0.0/16"}]}}).encode()
        times: dict[str, list[float]] = {"plugin ADD": [], "plugin DEL": [],
                                         "bridge ADD": [], "bridge DEL": []}
        try:
            netns("add", host_ns)
            for pod in pods:
                netns("add", pod)
            bridge = f"{CNI_DIR}/bridge"
            for pod in pods:  # interleaved, so both see the same machine state
                times["plugin ADD"].append(invoke(host_ns, plugin, "ADD", pod, flannel_conf,
                                                  str(work / "bin")))
                times["plugin DEL"].append(invoke(host_ns, plugin, "DEL", pod, flannel_conf,
                                                  str(work / "bin")))
                times["bridge ADD"].append(invoke(host_ns, bridge, "ADD", pod, delegate_conf,
                                                  str(work / "bin")))
                times["bridge DEL"].append(invoke(host_ns, bridge, "DEL", pod, delegate_conf,
                                                  str(work / "bin")))
        finally:
            for name in [*pods, host_ns]:
                subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    p50 = {key: statistics.median(values) * 1000 for key, values in times.items()}
    print(f"pods={args.pods}, p50 in ms (each includes 'ip netns exec')")
    for verb in ("ADD", "DEL"):
        plugin_ms, base_ms = p50[f"plugin {verb}"], p50[f"bridge {verb}"]
        print(f"  {verb}: baseline bridge alone {base_ms:.1f}, figure via flannel "
              f"{plugin_ms:.1f}, plugin's own {plugin_ms - base_ms:.1f} ms, "
              f"ratio {plugin_ms / base_ms:.2f}")


if __name__ == "__main__":
    main()
