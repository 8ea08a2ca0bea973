"""Benchmark: the udp forwarder against kernel vxlan, two namespaces over a 1500-MTU veth.

Per round (variants interleaved, medians reported): iperf3 single TCP stream, iperf3 UDP
64-byte packets (delivered pps), ping p50/p99, and the forwarder's CPU per data packet on
each side; the machine's background load (1-min loadavg, idle % over 1 s) before each round.
Then the placement question: how late an asyncio control loop's 5 ms timer fires, and the
TCP throughput, with the sending forwarder in a thread of the control-plane process vs in a
process of its own, while the control loop does busy work (JSON decoding in slices).
Last, how long ``set_peers`` takes to be acknowledged (the new table in use when it returns):
emptied, restored, and 20000 peers more (the tests check that it holds; this, how fast).

    .venv/bin/python -m bench.udp --rounds 3 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network

from flannel.kernel.host import Host
from flannel.udp.device import TunSpec, ensure_tun
from flannel.udp.forwarder import ForwarderConfig, UdpForwarder, cpu_seconds
from flannel.udp.worker import Worker
from tests.support import netns

TUN_MTU = 1472
NETWORK = IPv4Network("10.5.0.0/16")


def sh(*cmd: str, timeout: float = 60) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True,
                          timeout=timeout).stdout


def underlay_pair(tag: str) -> tuple[str, str]:
    a, b = netns.create(f"{tag}a"), netns.create(f"{tag}b")
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b,
             netns=a)
    for ns, ip in ((a, "172.31.0.1"), (b, "172.31.0.2")):
        netns.ip("addr", "add", f"{ip}/24", "dev", "eth0", netns=ns)
        netns.ip("link", "set", "eth0", "up", netns=ns)
    return a, b


def build_vxlan(a: str, b: str) -> tuple[str, str]:
    for ns, local, remote, inner in ((a, "172.31.0.1", "172.31.0.2", "10.6.0.1"),
                                     (b, "172.31.0.2", "172.31.0.1", "10.6.0.2")):
        netns.ip("link", "add", "vx0", "type", "vxlan", "id", "1", "local", local, "remote",
                 remote, "dev", "eth0", "dstport", "8472", netns=ns)
        netns.ip("addr", "add", f"{inner}/24", "dev", "vx0", netns=ns)
        netns.ip("link", "set", "vx0", "up", netns=ns)
    return "10.6.0.1", "10.6.0.2"


def udp_configs(a: str, b: str) -> list[ForwarderConfig]:
    configs = []
    for ns, underlay, base in ((a, "172.31.0.1", "10.5.1.0"), (b, "172.31.0.2", "10.5.2.0")):
        ensure_tun(TunSpec("flannel0", IPv4Address(base), TUN_MTU, NETWORK), Host(ns))
        configs.append(ForwarderConfig("flannel0", IPv4Address(underlay), 8285,
                                       IPv4Address(base), TUN_MTU, Host(ns)))
    return configs


PEERS = ({IPv4Network("10.5.2.0/24"): IPv4Address("172.31.0.2")},
         {IPv4Network("10.5.1.0/24"): IPv4Address("172.31.0.1")})


def background_load() -> tuple[float, float]:
    """(1-min load average, idle % of all CPUs over one second)."""
    def idle_total() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        return values[3] + values[4], sum(values)

    idle0, total0 = idle_total()
    time.sleep(1)
    idle1, total1 = idle_total()
    with open("/proc/loadavg") as loadavg:
        load = float(loadavg.read().split()[0])
    return load, 100 * (idle1 - idle0) / max(1, total1 - total0)


def iperf(client_ns: str, server_ns: str, src: str, dst: str, seconds: int, udp: bool
          ) -> dict:
    server = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B",
                               dst], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(["ip", "netns", "exec", server_ns, "ss", "-ltnH",
                                    "sport = :5201"], capture_output=True, text=True)
            if probe.stdout.strip():
                break
            time.sleep(0.05)
        cmd = ["ip", "netns", "exec", client_ns, "iperf3", "-J", "-c", dst, "-B", src, "-t",
               str(seconds)]
        if udp:
            cmd += ["-u", "-l", "64", "-b", "0"]
        return json.loads(sh(*cmd, timeout=seconds + 60))
    finally:
        server.kill()
        server.wait()


def ping_p50_p99(ns: str, src: str, dst: str) -> tuple[float, float]:
    out = sh("ip", "netns", "exec", ns, "ping", "-n", "-c", "200", "-i", "0.005", "-I", src,
             dst, timeout=60)
    times = sorted(float(line.split("time=")[1].split()[0]) for line in out.splitlines()
                   if "time=" in line)
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def measure(run_a: str, run_b: str, src: str, dst: str, seconds: int,
            forwarders: tuple[UdpForwarder, UdpForwarder] | None) -> dict:
    result: dict[str, float] = {}
    before = [(cpu_seconds(f.pid), f.status().counters) for f in forwarders or ()]
    tcp = iperf(run_a, run_b, src, dst, seconds, udp=False)
    result["gbps"] = tcp["end"]["sum_received"]["bits_per_second"] / 1e9
    if forwarders:
        after = [(cpu_seconds(f.pid), f.status().counters) for f in forwarders]
        sent = after[0][1]["tx_packets"] - before[0][1]["tx_packets"]
        received = after[1][1]["rx_packets"] - before[1][1]["rx_packets"]
        result["send_us"] = (after[0][0] - before[0][0]) / max(1, sent) * 1e6
        result["recv_us"] = (after[1][0] - before[1][0]) / max(1, received) * 1e6
        result["tun_writes_per_packet"] = (after[1][1]["tun_writes"]
                                           - before[1][1]["tun_writes"]) / max(1, received)
        result["packets_per_sendmsg"] = sent / max(1, after[0][1]["udp_sends"]
                                                   - before[0][1]["udp_sends"])
    udp = iperf(run_a, run_b, src, dst, max(3, seconds // 2), udp=True)["end"]["sum"]
    result["kpps"] = (udp["packets"] - udp["lost_packets"]) / udp["seconds"] / 1000
    result["ping_p50"], result["ping_p99"] = ping_p50_p99(run_a, src, dst)
    return result


# --- placement: thread of the control process vs process of its own ------------------


def start_in_thread(config: ForwarderConfig) -> tuple[socket.socket, threading.Thread]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    settings = {"tun": config.tun, "bind": str(config.bind), "port": config.port,
                "source": str(config.source), "mtu": config.mtu}

    def run() -> None:
        with config.host.entered():
            worker = Worker(settings, child)
        try:
            worker.run()
        finally:
            worker.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert json.loads(parent.recv(1000))["op"] == "ready"
    return parent, thread


async def control_loop(stop: threading.Event, leases: int) -> list[float]:
    """A stand-in control plane: a 5 ms ticker (lateness recorded) and busy work: decoding
    a snapshot of ``leases`` leases (one C call, holding the GIL throughout) every 2 ms."""
    lateness: list[float] = []
    snapshot = json.dumps([{"PublicIP": f"172.31.{i // 250}.{i % 250}", "BackendType": "udp",
                            "Subnet": f"10.{i // 250}.{i % 250}.0/24"} for i in range(leases)])

    async def ticker() -> None:
        while not stop.is_set():
            expected = time.perf_counter() + 0.005
            await asyncio.sleep(0.005)
            lateness.append(time.perf_counter() - expected)

    async def busy() -> None:
        while not stop.is_set():
            json.loads(snapshot)
            await asyncio.sleep(0.002)

    await asyncio.gather(ticker(), busy())
    return lateness


def placement(a: str, b: str, configs: list[ForwarderConfig], seconds: int,
              mode: str, leases: int) -> dict:
    stop = threading.Event()
    result: dict[str, object] = {}
    controls: list[tuple[socket.socket, threading.Thread]] = []
    forwarders: list[UdpForwarder] = []
    # The sending side (a) is the one placed; the receiving side is a process either way.
    if mode == "thread":
        control, thread = start_in_thread(configs[0])
        control.send(json.dumps({"op": "peers", "peers": [[str(k), str(v)] for k, v in
                                                         PEERS[0].items()]}).encode())
        control.recv(1000)
        controls.append((control, thread))
    for config, peers in list(zip(configs, PEERS, strict=True))[len(controls):]:
        forwarder = UdpForwarder(config)
        forwarder.start()
        forwarder.set_peers(peers)
        forwarders.append(forwarder)

    def traffic() -> None:
        result["gbps"] = iperf(a, b, "10.5.1.0", "10.5.2.0", seconds, udp=False)[
            "end"]["sum_received"]["bits_per_second"] / 1e9
        stop.set()

    worker = threading.Thread(target=traffic)
    worker.start()
    lateness = asyncio.run(control_loop(stop, leases))
    worker.join()
    for control, thread in controls:
        control.send(json.dumps({"op": "stop"}).encode())
        thread.join(10)
        control.close()
    for forwarder in forwarders:
        forwarder.stop()
    lateness.sort()
    result["late_p50_ms"] = statistics.median(lateness) * 1000
    result["late_p99_ms"] = lateness[int(len(lateness) * 0.99)] * 1000
    return result


def median_of(rounds: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--skip-placement", action="store_true")
    parser.add_argument("--placement-only", action="store_true")
    parser.add_argument("--slice-leases", type=int, default=500,
                        help="leases decoded per busy slice of the stand-in control plane")
    args = parser.parse_args()
    udp_a, udp_b = underlay_pair("u")
    vx_a, vx_b = underlay_pair("v")
    forwarders: list[UdpForwarder] = []
    try:
        configs = udp_configs(udp_a, udp_b)
        for config, peers in zip(configs, PEERS, strict=True):
            forwarder = UdpForwarder(config)
            forwarder.start()
            forwarder.set_peers(peers)
            forwarders.append(forwarder)
        vx_src, vx_dst = build_vxlan(vx_a, vx_b)
        variants: dict[str, Callable[[], dict]] = {
            "udp forwarder": lambda: measure(udp_a, udp_b, "10.5.1.0", "10.5.2.0",
                                             args.seconds, (forwarders[0], forwarders[1])),
            "kernel vxlan": lambda: measure(vx_a, vx_b, vx_src, vx_dst, args.seconds, None),
        }
        results: dict[str, list[dict]] = {name: [] for name in variants}
        for round_no in range(0 if args.placement_only else args.rounds):
            order = list(variants) if round_no % 2 == 0 else list(reversed(variants))
            for name in order:
                load, idle = background_load()
                figures = variants[name]()
                figures["load"], figures["idle"] = load, idle
                results[name].append(figures)
                print(f"round {round_no + 1} {name}: load {load:.2f}, idle {idle:.0f}%: " +
                      ", ".join(f"{k} {v:.3g}" for k, v in figures.items()
                                if k not in ("load", "idle")), flush=True)
        udp, vx = results["udp forwarder"], results["kernel vxlan"]
        if not args.placement_only:
            report(results, udp, vx, args)
            peer_swap(forwarders[0], PEERS[0], args.rounds)
        for forwarder in forwarders:
            forwarder.stop()
        forwarders.clear()
        if not args.skip_placement:
            compare_placement(udp_a, udp_b, configs, args)
    finally:
        for forwarder in forwarders:
            forwarder.stop()
        for ns in (udp_a, udp_b, vx_a, vx_b):
            netns.delete(ns)


def report(results: dict[str, list[dict]], udp: list[dict], vx: list[dict],
           args: argparse.Namespace) -> None:
    print(f"\nmedians of {args.rounds} rounds, single TCP stream {args.seconds} s:")
    for name, rounds in results.items():
        line = (f"  {name}: {median_of(rounds, 'gbps'):.3f} Gbit/s, "
                f"{median_of(rounds, 'kpps'):.1f} kpps (UDP 64 B), ping p50 "
                f"{median_of(rounds, 'ping_p50'):.3f} / p99 {median_of(rounds, 'ping_p99'):.3f}"
                f" ms, background load {median_of(rounds, 'load'):.2f} "
                f"(idle {median_of(rounds, 'idle'):.0f}%)")
        if "send_us" in rounds[0]:
            line += (f", CPU {median_of(rounds, 'send_us'):.1f} us/packet sending, "
                     f"{median_of(rounds, 'recv_us'):.1f} us/packet receiving, "
                     f"{median_of(rounds, 'tun_writes_per_packet'):.3f} TUN writes/packet, "
                     f"{median_of(rounds, 'packets_per_sendmsg'):.1f} packets/sendmsg")
        print(line)
    print(f"  ratio udp/vxlan: TCP {median_of(udp, 'gbps') / median_of(vx, 'gbps'):.3f}, "
          f"pps {median_of(udp, 'kpps') / median_of(vx, 'kpps'):.3f}, ping p50 "
          f"{median_of(udp, 'ping_p50') / median_of(vx, 'ping_p50'):.2f}")


def peer_swap(forwarder: UdpForwarder, peers: dict[IPv4Network, IPv4Address],
              rounds: int) -> None:
    many = {IPv4Network((0x0A800000 + (i << 8), 24)): IPv4Address("172.31.0.9")
            for i in range(20000)}
    tables = {"emptied": {}, "restored": peers, "20000 more": {**many, **peers}}
    took: dict[str, list[float]] = {name: [] for name in tables}
    for _ in range(max(5, rounds)):
        for name, table in tables.items():
            started = time.perf_counter()
            forwarder.set_peers(table)
            took[name].append((time.perf_counter() - started) * 1000)
    forwarder.set_peers(peers)
    print("  set_peers until acknowledged, median: " + ", ".join(
        f"{name} {statistics.median(ms):.1f} ms" for name, ms in took.items()))


def compare_placement(udp_a: str, udp_b: str, configs: list[ForwarderConfig],
                      args: argparse.Namespace) -> None:
    print(f"\nplacement (control loop: 5 ms ticker + decoding {args.slice_leases} leases "
          "every 2 ms):")
    placements: dict[str, list[dict]] = {"thread": [], "process": []}
    for round_no in range(args.rounds):
        for mode in ("thread", "process") if round_no % 2 == 0 else ("process", "thread"):
            load, idle = background_load()
            figures = placement(udp_a, udp_b, configs, args.seconds, mode, args.slice_leases)
            placements[mode].append(figures)
            print(f"  round {round_no + 1} {mode}: load {load:.2f}, idle {idle:.0f}%: "
                  f"{figures['gbps']:.3f} Gbit/s, timer late p50 "
                  f"{figures['late_p50_ms']:.2f} / p99 {figures['late_p99_ms']:.2f} ms",
                  flush=True)
    for mode, rounds in placements.items():
        print(f"  {mode}: {median_of(rounds, 'gbps'):.3f} Gbit/s, timer late p50 "
              f"{median_of(rounds, 'late_p50_ms'):.2f} / p99 "
              f"{median_of(rounds, 'late_p99_ms'):.2f} ms")


if __name__ == "__main__":
    main()
