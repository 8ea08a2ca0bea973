"""``flannelctl leases reserve`` in a running cluster: the next node that starts with the
reserved public IP gets the reserved subnet, and keeps it without expiry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flannel_lab.cli import build

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}


def test_reservation_is_honoured_by_the_next_node(make_lab):
    lab = make_lab()
    build(lab, 1, CONFIG)
    lab.add_node(2)
    proc = subprocess.run(
        ["ip", "netns", "exec", lab.node_ns(1), FLANNELCTL, "leases", "reserve",
         "10.244.77.0/24", "--public-ip", lab.node(2).address,
         f"--etcd-endpoints={lab.state.etcd_endpoint}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lab.start_flanneld(2)
    assert lab.wait_subnet_env(2)["FLANNEL_SUBNET"] == "10.244.77.1/24"
    listing = subprocess.run(
        ["ip", "netns", "exec", lab.node_ns(1), FLANNELCTL, "leases", "list",
         f"--etcd-endpoints={lab.state.etcd_endpoint}"],
        capture_output=True, text=True, timeout=60, check=False).stdout
    row = next(line for line in listing.splitlines() if line.startswith("10.244.77.0/24"))
    assert row.split()[1:4] == ["-", lab.node(2).address, "vxlan"]
    assert "never (reservation)" in row
