"""Doctor tells the node's faults from its own bugs: a check failing with a declared error
(a file it cannot read, a tool that fails) is a warning about the node; any other exception
is a bug in doctor, which ends it with exit 1, one line saying so and the traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from flannel.ops import doctor
from flannel.ops.checks import Context
from flannel.ops.findings import Finding
from flannel.ops.kernelview import ToolError
from flannel.ops.options import DoctorOptions
from flannel.ops.storeflags import StoreOptions
from flannel.settings import EtcdSettings


def empty_context() -> Context:
    return Context(subnet_file=Path("/nonexistent/subnet.env"), sysctl_root=Path("/proc/sys"),
                   cni_bin_dirs=[], cni_conf_dirs=[], probe_timeout=1.0, fix_checksum=False)


def unreadable(ctx: Context) -> list[Finding]:
    raise PermissionError(13, "Permission denied", "/proc/sys/net/ipv4/ip_forward")


def tool_fails(ctx: Context) -> list[Finding]:
    raise ToolError("ip -j link show: exit 255: Cannot open netlink socket")


def buggy(ctx: Context) -> list[Finding]:
    return [Finding("routes", "error", ctx.no_such_field)]  # type: ignore[attr-defined]


def passes(ctx: Context) -> list[Finding]:
    return []


def test_declared_errors_are_warnings_about_the_node(monkeypatch):
    monkeypatch.setattr(doctor, "all_checks", lambda: [("sysctl", unreadable),
                                                       ("device", tool_fails),
                                                       ("cni", passes)])
    found = doctor.diagnose(empty_context())
    assert [(f.check, f.severity) for f in found] == [("sysctl", "warning"),
                                                       ("device", "warning")]
    assert "the sysctl check could not run: [Errno 13] Permission denied" in found[0].what


@pytest.mark.parametrize("error", [TypeError, KeyError, AttributeError, ValueError])
def test_a_bug_in_a_check_is_not_a_warning(monkeypatch, error):
    def check(ctx: Context) -> list[Finding]:
        raise error("a bug")

    monkeypatch.setattr(doctor, "all_checks", lambda: [("cni", passes), ("routes", check)])
    with pytest.raises(error) as raised:
        doctor.diagnose(empty_context())
    assert "in doctor's routes check" in raised.value.__notes__


def test_doctor_ends_on_a_bug_with_exit_1_and_its_traceback(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "gather", lambda opts: empty_context())
    monkeypatch.setattr(doctor, "all_checks", lambda: [("routes", buggy)])
    opts = DoctorOptions(StoreOptions(EtcdSettings(), "/nonexistent/subnet.env"))
    assert doctor.cmd_doctor(opts) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no verdict about the node
    first, *rest = err.splitlines()
    assert first == ("flannelctl doctor: stopped on a bug in flannelctl, not a fault of this "
                     "node: AttributeError: 'Context' object has no attribute 'no_such_field' "
                     "(please report it with the traceback below)")
    assert rest[0] == "Traceback (most recent call last):"
    assert "in buggy" in err and "in doctor's routes check" in err
