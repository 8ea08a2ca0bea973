"""Where ``flannelctl status`` asks: flags win over the flanneld it would find, and the
flanneld's own arguments are read from its command line however it was started."""

from __future__ import annotations

from pathlib import Path

import pytest

from flannel.ctl import build_parser, ops_options
from flannel.ops.discover import flanneld_argv
from flannel.ops.status import Where, locate


def where(*argv: str, environ: dict[str, str] | None = None) -> Where:
    return locate(ops_options(build_parser().parse_args(["status", *argv])), environ or {})


def test_flags_win_in_order_health_url_socket_subnet_file():
    env = {"FLANNELD_SUBNET_FILE": "/from/env/subnet.env"}
    assert where("--health-url=http://127.0.0.1:8081", "--socket=/s.sock",
                 "--subnet-file=/f/subnet.env", environ=env) == \
        Where(url="http://127.0.0.1:8081")
    assert where("--socket=/s.sock", "--subnet-file=/f/subnet.env", environ=env) == \
        Where(socket=Path("/s.sock"))
    assert where("--subnet-file=/f/subnet.env", environ=env) == \
        Where(socket=Path("/f/flanneld.sock"))
    assert where(environ=env) == Where(socket=Path("/from/env/flanneld.sock"))


@pytest.mark.parametrize(("cmdline", "args"), [
    (b"/opt/bin/flanneld\0--ip-masq\0--iface=eth0\0", ["--ip-masq", "--iface=eth0"]),
    (b"/venv/bin/python\0/venv/bin/flanneld\0--subnet-file=/x/subnet.env\0",
     ["--subnet-file=/x/subnet.env"]),
    (b"flanneld\0", []),
])
def test_flanneld_arguments_from_its_command_line(cmdline, args):
    assert flanneld_argv(cmdline) == args
