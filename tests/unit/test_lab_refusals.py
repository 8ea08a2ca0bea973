"""``flannel-lab up`` refuses, before building anything, in one line and with exit status 2,
what flanneld would refuse: a backend that carries IPv4 only with ``--ipv6`` (as the
backend's own footprint declares it), numbers out of range. And a node whose flanneld exits
is reported by the reason its log gives, not by its whole log."""

from __future__ import annotations

import pytest

from flannel.backend import backend_class, supported
from flannel_lab.cli import main as lab_main
from flannel_lab.cluster import exit_reason

IPV4_ONLY = sorted(name for name in supported() if not backend_class(name).footprint.dual_stack)
CARRIERS = "extension, host-gw, vxlan, wireguard"


def test_the_backends_that_carry_ipv4_only_are_those_flanneld_refuses_with_ipv6():
    # The lab's refusal comes from the footprints; this is what they declare today.
    assert IPV4_ONLY == ["ali-vpc", "aws-vpc", "gce", "ipip", "ipsec", "tencent-vpc", "udp"]


@pytest.mark.parametrize("backend", [name for name in IPV4_ONLY if name != "tencent-vpc"])
def test_an_ipv4_only_backend_with_ipv6_is_refused_before_building(tmp_path, capsys, backend):
    root = tmp_path / "labs"
    code = lab_main(["--root", str(root), "up", "--name", "never", "--backend", backend,
                     "--ipv6"])
    assert code == 2
    assert capsys.readouterr() == ("", (
        f"flannel-lab: the {backend} backend carries IPv4 only, and this network enables "
        "IPv6: flanneld refuses to start; drop --ipv6 (EnableIPv6), or choose a backend that "
        f"carries IPv6 ({CARRIERS})\n"))
    assert not root.exists()


def test_an_ipv6_only_network_of_an_ipv4_only_backend_is_refused(tmp_path, capsys):
    config = ('{"Network": "10.1.0.0/16", "EnableIPv4": false, "EnableIPv6": true, '
              '"IPv6Network": "fd00:1::/56", "Backend": {"Type": "udp"}}')
    code = lab_main(["--root", str(tmp_path / "labs"), "up", "--name", "never",
                     f"--config={config}"])
    assert code == 2
    assert capsys.readouterr().err == (
        "flannel-lab: --config: the udp backend carries IPv4 only, and this network enables "
        "IPv6: flanneld refuses to start; drop --ipv6 (EnableIPv6), or choose a backend that "
        f"carries IPv6 ({CARRIERS})\n")


@pytest.mark.parametrize(("argv", "said"), [
    (["--pods-per-node", "-1"], "argument --pods-per-node: '-1': give a whole number from 0 "
                                "to 100"),
    (["--pods-per-node", "many"], "argument --pods-per-node: 'many': give a whole number "
                                  "from 0 to 100"),
    (["--nodes", "0"], "argument --nodes: '0': give a whole number from 1 to 200"),
    (["--nodes", "201"], "argument --nodes: '201': give a whole number from 1 to 200"),
    (["--second-underlay", "-2"], "argument --second-underlay: '-2': give a whole number "
                                  "from 0 to 200"),
])
def test_numbers_out_of_range_are_refused_in_one_line(tmp_path, capsys, argv, said):
    root = tmp_path / "labs"
    with pytest.raises(SystemExit) as ended:
        lab_main(["--root", str(root), "up", "--name", "never", *argv])
    assert ended.value.code == 2
    assert capsys.readouterr() == ("", f"flannel-lab up: {said} (--help lists the options)\n")
    assert not root.exists()


def test_a_second_underlay_no_node_sits_on_is_refused(tmp_path, capsys):
    root = tmp_path / "labs"
    code = lab_main(["--root", str(root), "up", "--name", "never", "--nodes", "2",
                     "--second-underlay", "3", "--backend", "alloc"])
    assert code == 2
    assert capsys.readouterr().err == (
        "flannel-lab: --second-underlay=3: no node would sit on the second underlay; give 1 "
        "to --nodes (2), or 0 for one underlay\n")
    assert not root.exists()


def test_restart_needs_a_node_number():
    with pytest.raises(SystemExit) as ended:
        lab_main(["restart", "--name", "x", "--node", "0"])
    assert ended.value.code == 2


RUN = ("I1207 05:00:53.773076   21774 daemon.py:521] CLI flags config: --etcd-endpoints=x "
       "(flag)\n"
       "I1207 05:00:53.816701   21774 daemon.py:324] Using interface with name eth0\n")


@pytest.mark.parametrize(("log", "reason"), [
    (RUN + "E1207 05:00:53.825826   21774 daemon.py:532] cannot create ipip device "
           "flannel.ipip: this kernel has no ipip support\n",
     "cannot create ipip device flannel.ipip: this kernel has no ipip support"),
    # The run before the last does not count; the last error block does, in order.
    ("E1207 05:00:50.000000   21000 daemon.py:532] an older run's error\n" + RUN
     + "E1207 05:00:54.000000   21774 manager.py:90] could not reach etcd\n"
       "E1207 05:00:54.100000   21774 daemon.py:532] Exiting: store unreachable\n",
     "could not reach etcd; Exiting: store unreachable"),
    (RUN + "W1207 05:00:55.000000   21774 daemon.py:492] Lease has been revoked. Shutting "
           "down daemon.\n"
           "I1207 05:00:55.000000   21774 daemon.py:407] Exiting: own lease revoked\n",
     "no error in its log, whose last line is: Exiting: own lease revoked"),
    (RUN + "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: boom\n",
     "no error in its log, whose last line is: ValueError: boom"),
    ("", "its log is empty"),
])
def test_the_reason_a_flanneld_exited_is_its_last_error(log, reason):
    assert exit_reason(log) == reason
