"""The udp backend's TUN device where /dev/net/tun is missing (a container without it, as
in the default DaemonSet): a message saying what to give it, not a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.netns

PROBE = textwrap.dedent("""
    from ipaddress import IPv4Address, IPv4Network
    from flannel.udp.device import TunSpec, ensure_tun
    from flannel.udp.tunfd import TunError
    try:
        ensure_tun(TunSpec("flannel0", IPv4Address("10.6.1.0"), 1472,
                           IPv4Network("10.6.0.0/16")))
    except TunError as err:
        print(err)
""")


def test_a_missing_dev_net_tun_is_said_with_the_fix(ns):
    # Its own mount namespace with an empty /dev/net: the host's /dev is never changed.
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs none /dev/net && exec ip netns exec "$0" "$1" -c "$2"',
         ns, sys.executable, PROBE], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "cannot open /dev/net/tun for flannel0: No such file or directory; the udp backend "
        "needs the TUN device: load the tun module (modprobe tun), and in a container give "
        "it /dev/net/tun (privileged: true, as Go flannel's udp backend needs, or a hostPath "
        "volume of type CharDevice)")
