"""One peer whose data the extension backend's subnet-add command refuses: flanneld as a
process in its own netns with a real etcd and a real add script. The node stays ready, the
other peer is programmed, the bad one is shown in /status and /metrics and retried with
backoff, and once its lease is fixed it is programmed at once."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from tests.integration.test_flanneld import PREFIX, flanneld, node  # noqa: F401
from tests.support import netns
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

PORT = 8081
FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
GOOD, BAD = "10.5.7.0-24", "10.5.8.0-24"
# Programs a route for a peer whose data is a MAC address; refuses anything else.
ADD = """#!/bin/sh
date +%s.%N >> "$TRIES.$SUBNET_FILE"
read -r data
case "$data" in
  ??:??:??:??:??:??) exec ip route replace "$SUBNET" dev lo ;;
  *) echo "not a VTEP MAC: $data"; exit 1 ;;
esac
"""


def peer_value(third: int, data: str) -> str:
    return json.dumps({"PublicIP": f"10.99.0.{third}", "PublicIPv6": None,
                       "BackendType": "extension", "BackendData": data})


def route(ns: str, subnet: str) -> str:
    return netns.ip("route", "show", subnet, netns=ns).stdout


def status(ns: str) -> dict:
    code, body = http_get(ns, f"http://127.0.0.1:{PORT}/status")
    assert code == 200, body
    return json.loads(body)


def test_a_peer_the_add_command_refuses_leaves_the_node_ready(node, tmp_path, monkeypatch):  # noqa: F811
    ns, server = node
    script = tmp_path / "add-peer"
    script.write_text(ADD.replace("$SUBNET_FILE", "$(echo $SUBNET | tr / -)"))
    script.chmod(0o755)
    monkeypatch.setenv("TRIES", str(tmp_path / "tries"))
    server.ctl("put", f"{PREFIX}/config", json.dumps({"Network": "10.5.0.0/16", "Backend": {
        "Type": "extension", "PreStartupCommand": "echo 0e:00:00:00:00:01",
        "SubnetAddCommand": str(script)}}))
    server.ctl("put", f"{PREFIX}/subnets/{GOOD}", peer_value(7, "0e:00:00:00:00:07"))
    server.ctl("put", f"{PREFIX}/subnets/{BAD}", peer_value(8, "garbage"))
    proc = flanneld(tmp_path, ns, server, "--healthz-ip=127.0.0.1", f"--healthz-port={PORT}")
    proc.start()
    try:
        wait_until(lambda: http_get(ns, f"http://127.0.0.1:{PORT}/readyz")[0] == 200, 60,
                   what=f"ready despite the bad peer:\n{proc.log}")
        assert route(ns, "10.5.7.0/24").startswith("10.5.7.0/24 dev lo")
        assert route(ns, "10.5.8.0/24") == ""
        peers = status(ns)["peers"]
        assert peers["refused"] == 1
        assert peers["refused_reasons"] == {
            BAD: "subnet-add command failed (exit status 1): not a VTEP MAC: garbage"}
        table = subprocess.run(["ip", "netns", "exec", ns, FLANNELCTL, "status",
                                f"--health-url=http://127.0.0.1:{PORT}"], capture_output=True,
                               text=True, timeout=30, check=False).stdout
        assert ("2 known, 2 for this backend, 1 programmed, 0 skipped as invalid, 1 refused "
                "by the backend's engine") in table, table
        assert (f"  engine    {BAD}: subnet-add command failed (exit status 1): not a VTEP "
                "MAC: garbage") in table, table
        _, metrics = http_get(ns, f"http://127.0.0.1:{PORT}/metrics")
        assert 'flannel_engine_extension_bad_peers{engine="extension commands"} 1.0' in metrics

        # Retried with backoff (5 s, then 10 s), not every few seconds; logged once.
        tries = tmp_path / f"tries.{BAD}"
        wait_until(lambda: len(tries.read_text().split()) >= 3, 40,
                   what=f"three tries of the bad peer:\n{proc.log}")
        times = [float(t) for t in tries.read_text().split()]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        print(f"\nbad peer tried at intervals of {[round(g, 2) for g in gaps]} s")
        assert 4.5 <= gaps[0] < 9 and 9 <= gaps[1] < 16, gaps
        assert proc.log.count(f"skipping extension lease {BAD}") == 1
        assert http_get(ns, f"http://127.0.0.1:{PORT}/readyz")[0] == 200

        # The owner fixes its data: the changed lease is tried at once.
        server.ctl("put", f"{PREFIX}/subnets/{BAD}", peer_value(8, "0e:00:00:00:00:08"))
        wait_until(lambda: route(ns, "10.5.8.0/24") != "", 5, what=f"fixed peer:\n{proc.log}")
        assert status(ns)["peers"]["refused"] == 0
        assert "Traceback" not in proc.log, proc.log
    finally:
        proc.stop()
