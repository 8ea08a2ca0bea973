"""flanneld flags that would hurt once running, tried on the real executable: refused at
parse time with exit 2 and a message naming the flag; the etcd TLS warning only when TLS is
off; the health server only on ``--healthz-ip``."""

from __future__ import annotations

import os
import subprocess

import pytest

from flannel_lab.etcd import free_port
from tests.support import netns
from tests.support.flanneld import FLANNELD, Flanneld
from tests.support.tls import make_tls_files
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

HINT = "Run 'flanneld --help' for the list of flags."


@pytest.mark.parametrize(("argv", "env", "first_line"), [
    (["--iptables-resync=0"], {},
     "flanneld: --iptables-resync=0: out of acceptable range; give seconds from 1 to 86400"),
    (["--public-ip=0.0.0.0"], {},
     "flanneld: --public-ip=0.0.0.0: the unspecified address, which other nodes cannot "
     "reach; give this node's address on the network between the nodes"),
    (["--subnet-lease-ttl=100000000000s"], {},
     "flanneld: --subnet-lease-ttl=100000000000s: longer than etcd allows; give at most "
     "9000000000s"),
    (["--healthz-ip=flannel.invalid"], {},
     "flanneld: --healthz-ip=flannel.invalid: not an IP address; give the address to listen "
     "on, such as 127.0.0.1, or 0.0.0.0 for every address"),
    ([], {"FLANNELD_PUBLIC_IPV6": "::1"},
     "flanneld: --public-ipv6=::1 (from FLANNELD_PUBLIC_IPV6): a loopback address, which "
     "other nodes cannot reach; give this node's address on the network between the nodes"),
])
def test_flanneld_refuses_the_value_and_exits_2(argv, env, first_line, tmp_path):
    result = subprocess.run([FLANNELD, "--etcd-endpoints=http://127.0.0.1:1",
                             f"--subnet-file={tmp_path / 'subnet.env'}", *argv],
                            capture_output=True, text=True, timeout=30, check=False,
                            env={**os.environ, **env})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [first_line, HINT]
    assert not (tmp_path / "subnet.env").exists()


def _fetching_config(proc: Flanneld) -> None:
    proc.wait_log("Couldn't fetch network config", timeout=20)


def test_tls_warning_only_when_tls_is_off(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    closed = free_port()  # nothing listens: flanneld keeps retrying the config
    secure = Flanneld(tmp_path, [f"--etcd-endpoints=https://127.0.0.1:{closed}",
                                 f"--etcd-cafile={tls.ca}",
                                 f"--subnet-file={tmp_path / 'a.env'}"], name="https").start()
    plain = Flanneld(tmp_path, [f"--etcd-endpoints=http://127.0.0.1:{closed}",
                                f"--subnet-file={tmp_path / 'b.env'}"], name="http").start()
    try:
        _fetching_config(secure)
        _fetching_config(plain)
        assert "TLS is off" not in secure.log
        assert ("etcd TLS is off: use https:// etcd endpoints with --etcd-cafile (and "
                "--etcd-certfile, --etcd-keyfile if etcd wants client certificates)"
                ) in plain.log
    finally:
        secure.stop()
        plain.stop()


def test_health_listens_on_healthz_ip_only(ns, tmp_path):
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.98.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    port = 8081
    proc = Flanneld(tmp_path, ["--etcd-endpoints=http://127.0.0.1:1",
                               f"--subnet-file={tmp_path / 'subnet.env'}",
                               "--healthz-ip=10.98.0.2", f"--healthz-port={port}"],
                    netns=ns).start()
    try:
        wait_until(lambda: http_get(ns, f"http://10.98.0.2:{port}/healthz")[0] == 200, 20,
                   what="health server on --healthz-ip")
        assert http_get(ns, f"http://127.0.0.1:{port}/healthz")[0] == 0  # not listening
        assert f"health server listening on 10.98.0.2 port {port}" in proc.log
        assert "every address of this host answers" not in proc.log
    finally:
        proc.stop()


def test_default_healthz_ip_is_said_to_answer_everywhere(ns, tmp_path):
    proc = Flanneld(tmp_path, ["--etcd-endpoints=http://127.0.0.1:1",
                               f"--subnet-file={tmp_path / 'subnet.env'}",
                               "--healthz-port=8081"], netns=ns).start()
    try:
        proc.wait_log("health server listening on 0.0.0.0 port 8081 (/healthz, /readyz, /metrics, "
                      "/status); "
                      "every address of this host answers, --healthz-ip limits that")
        status, body = http_get(ns, "http://127.0.0.1:8081/readyz")
        assert (status, body) == (503, "flanneld is not ready yet: waiting for the network "
                                       "config\n")
    finally:
        proc.stop()


def test_start_up_line_shows_every_option_with_its_source(tmp_path):
    """As Go's "CLI flags config: {...}", but each option says where it came from, and the
    etcd password is masked (Go prints it)."""
    closed = free_port()
    proc = Flanneld(tmp_path, [f"--etcd-endpoints=http://127.0.0.1:{closed}",
                               f"--subnet-file={tmp_path / 'subnet.env'}", "-v=2"],
                    env={"FLANNELD_ETCD_PASSWORD": "s3cret-pw", "FLANNELD_ETCD_USERNAME": "fl",
                         "FLANNELD_IPTABLES_RESYNC": "7"}).start()
    try:
        _fetching_config(proc)
        (line,) = [x for x in proc.log.splitlines() if "CLI flags config: " in x]
        assert line.startswith("I")
        for shown in (f"--etcd-endpoints=http://127.0.0.1:{closed} (flag)",
                      "-v=2 (flag)", "--etcd-username=fl (FLANNELD_ETCD_USERNAME)",
                      "--etcd-password=***** (FLANNELD_ETCD_PASSWORD)",
                      "--iptables-resync=7 (FLANNELD_IPTABLES_RESYNC)",
                      "--etcd-prefix=/coreos.com/network (default)",
                      "--subnet-lease-ttl=24h0m0s (default)"):
            assert shown in line
        assert "s3cret-pw" not in proc.log
    finally:
        proc.stop()


def test_key_without_cert_starts_with_a_warning(tmp_path):
    """Go flannel warns and connects without a client certificate; so do we (it was fatal)."""
    tls = make_tls_files(tmp_path / "tls")
    closed = free_port()
    proc = Flanneld(tmp_path, [f"--etcd-endpoints=http://127.0.0.1:{closed}",
                               f"--etcd-keyfile={tls.client_key}",
                               f"--subnet-file={tmp_path / 'subnet.env'}"]).start()
    try:
        _fetching_config(proc)
        assert ("--etcd-keyfile is given without --etcd-certfile: no client certificate is "
                "sent to etcd; give both to authenticate with one") in proc.log
    finally:
        proc.stop()
