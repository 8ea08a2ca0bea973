"""The CNI plugin executable on hostile and edge input: it always answers a CNI result or a
CNI error object on stdout, exits non-zero on every error, and writes nothing it should not.

Every case runs the plugin in a fresh ``python -I -S`` process (tests/support/cniexec.py).
Delegates that must misbehave are tiny scripts written into tmp_path.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.support.cniexec import cni_env, pyenv_python, run_plugin, write_delegate

ENV_V4 = "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\n" \
         "FLANNEL_IPMASQ=true\n"
RESULT = '{"cniVersion":"1.0.0","ips":[{"address":"10.1.17.2/24"}]}'


class Node:
    """One subnet.env, one dataDir and a bin dir whose ``bridge`` records its stdin."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.subnet_file = tmp / "subnet.env"
        self.subnet_file.write_text(ENV_V4)
        self.data_dir = tmp / "data"
        self.bin = tmp / "bin"
        self.recorder("bridge")

    def recorder(self, name: str, result: str = RESULT) -> Path:
        return write_delegate(self.bin, name, f'cat > "$0.$CNI_COMMAND.in"\n'
                                              f"printf '%s' '{result}'\n")

    def received(self, name: str = "bridge", command: str = "ADD") -> str:
        return (self.bin / f"{name}.{command}.in").read_text()

    def conf(self, **extra: object) -> dict:
        return {"cniVersion": "1.0.0", "name": "cbr0", "type": "flannel",
                "subnetFile": str(self.subnet_file), "dataDir": str(self.data_dir), **extra}

    def env(self, command: str, container_id: str = "c1", **extra: str) -> dict:
        return {**cni_env(command, container_id, cni_path=str(self.bin)), **extra}

    def call(self, command: str, conf: dict | bytes | None = None, container_id: str = "c1",
             **kwargs: object):
        return run_plugin(self.conf() if conf is None else conf,
                          self.env(command, container_id), **kwargs)

    def saved(self, container_id: str = "c1") -> dict:
        return json.loads((self.data_dir / container_id).read_text())

    def files(self) -> list[str]:
        return sorted(p.name for p in self.data_dir.iterdir()) if self.data_dir.exists() \
            else []


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


# ---- item 1: malformed JSON ---------------------------------------------------------------

@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK", "VERSION"])
@pytest.mark.parametrize("stdin", [b"{", b"{bad", b'{"name":"x",}', b'{"name":"cbr0","cniV',
                                   b"\xff\xfe{}"])
def test_malformed_json_is_code_6(node, command, stdin):
    error = node.call(command, stdin).error()
    assert error["code"] == 6, error
    assert error["cniVersion"] == "1.1.0"


@pytest.mark.parametrize("stdin", [b"[" * 100000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
                                   b'{"name":"cbr0","x":"' + b"y" * (2 << 20) + b'"}'])
def test_deep_or_huge_input_is_refused(node, stdin):
    error = node.call("ADD", stdin).error()
    assert error["code"] == 6
    assert "nested deeper than 64 levels" in error["msg"] or "larger than" in error["msg"]
    assert node.files() == []


# ---- item 6 and issue 9 item 5: edge values -----------------------------------------------

@pytest.mark.parametrize(("extra", "code", "message"), [
    ({"name": None}, 7, "missing network name"),
    ({"name": 5}, 6, "'name' must be a string"),
    ({"cniVersion": 1.0}, 6, "'cniVersion' must be a string"),
    ({"cniVersion": "9.9.9"}, 1, "incompatible CNI versions"),
    ({"subnetFile": 1}, 7, "'subnetFile' must be a string"),
    ({"dataDir": "/tmp/a\u0000b"}, 7, "'dataDir' must be a file system path"),
    ({"dataDir": "/tmp/\udc80"}, 7, "'dataDir' must be a file system path"),
    ({"runtimeConfig": [1]}, 7, "'runtimeConfig' must be a JSON object"),
    ({"delegate": {"type": 7}}, 7, "must have (string) 'type' field"),
    ({"ipam": "host-local"}, 7, "'ipam' must be a JSON object"),
])
def test_bad_fields_are_refused_before_anything_is_saved(node, extra, code, message):
    answer = node.call("ADD", node.conf(**extra))
    error = answer.error()
    assert (error["code"], message in error["msg"]) == (code, True), error
    assert isinstance(error["cniVersion"], str)
    assert node.files() == []
    assert not (node.bin / "bridge.ADD.in").exists()


@pytest.mark.parametrize("text", [b'{"name":"cbr0","cniVersion":"1.0.0","x":NaN}',
                                  b'{"name":"cbr0","delegate":{"mtu":NaN}}',
                                  b'{"name":"cbr0","delegate":{"mtu":1e400}}',
                                  b'{"name":"cbr0","delegate":{"mtu":-Infinity}}'])
def test_nan_and_out_of_range_numbers_are_code_6(node, text):
    error = node.call("ADD", text).error()
    assert error["code"] == 6
    assert node.files() == []


def test_non_utf8_bytes_in_a_subnet_env_comment_are_ignored(node):
    node.subnet_file.write_bytes(b"# \xff\xfe caf\xe9\n" + ENV_V4.encode() + b"X=\x80\n")
    answer = node.call("ADD")
    assert answer.code == 0, answer
    assert json.loads(node.received())["ipam"]["ranges"] == [[{"subnet": "10.1.17.0/24"}]]


def test_non_utf8_bytes_in_a_used_value_are_reported(node):
    node.subnet_file.write_bytes(ENV_V4.encode() + b"FLANNEL_SUBNET=10.1.\xff.1/24\n")
    error = node.call("ADD").error()
    assert "failed to load flannel 'subnet.env' file" in error["msg"]
    assert "is not an IP address" in error["msg"]


@pytest.mark.parametrize("line", ["FLANNEL_MTU=4294967296", "FLANNEL_MTU=\u0661\u0664",
                                  "FLANNEL_MTU=+1400", "FLANNEL_MTU=", "FLANNEL_MTU=1 400"])
def test_flannel_mtu_out_of_range_is_refused(node, line):
    node.subnet_file.write_text(ENV_V4 + line + "\n")
    error = node.call("ADD").error()
    assert "is not an unsigned 32-bit integer" in error["msg"]
    assert node.files() == []


def test_flannel_mtu_at_the_top_of_the_range_is_accepted(node):
    node.subnet_file.write_text(ENV_V4 + "FLANNEL_MTU=4294967295\n")
    assert node.call("ADD").code == 0
    assert node.saved()["mtu"] == 4294967295


def test_subnet_file_that_is_a_fifo_does_not_hang(node):
    fifo = node.tmp / "fifo.env"
    os.mkfifo(fifo)
    error = node.call("ADD", node.conf(subnetFile=str(fifo)), timeout=20).error()
    assert error["code"] == 5 and "is not a regular file" in error["msg"]


# ---- item 3: numbers ----------------------------------------------------------------------

def test_numbers_reach_the_delegate_as_go_writes_them(node):
    conf = node.conf(delegate={"mtu": 1400.0, "big": 9007199254740993, "f": 1.5,
                               "tiny": 1e-7, "huge": 1e21})
    assert node.call("ADD", conf).code == 0
    sent = node.received()
    assert '"mtu":1400,' in sent and '"big":9007199254740993' in sent
    assert '"f":1.5' in sent and '"tiny":1e-7' in sent and '"huge":1e+21' in sent
    assert (node.data_dir / "c1").read_text() == sent


# ---- item 4: fields -----------------------------------------------------------------------

def test_ipam_route_fields_are_kept_like_cni_types_route(node):
    routes = [{"dst": "10.96.0.5/12", "gw": "10.1.17.20", "mtu": 1400.0, "advmss": 1360,
               "priority": 10, "table": 0, "scope": 253, "bogus": 1},
              {"dst": "fd00::1:0/112", "gw": "", "mtu": 0, "table": None}]
    assert node.call("ADD", node.conf(ipam={"routes": routes})).code == 0
    assert node.saved()["ipam"]["routes"] == [
        {"dst": "10.96.0.5/12", "gw": "10.1.17.20", "mtu": 1400, "advmss": 1360,
         "priority": 10, "table": 0, "scope": 253},
        {"dst": "fd00::1:0/112"}, {"dst": "10.1.0.0/16"}]


def test_runtime_config_null_is_not_written(node):
    assert node.call("ADD", node.conf(runtimeConfig=None)).code == 0
    assert "runtimeConfig" not in node.saved()


# ---- item 5: delegate output --------------------------------------------------------------

@pytest.mark.parametrize(("script", "expect"), [
    ("exit 1\n", "failed (exit status 1) without a CNI error and printed nothing"),
    ("echo 'panic: runtime error'; exit 2\n", "its stdout began: 'panic: runtime error'"),
    ("kill -9 $$\n", "killed by signal 9"),
    ("echo '{\"code\":\"x\"}'; exit 1\n", "without a CNI error"),
    ("echo garbage\n", "succeeded but printed no CNI result (stdout began: 'garbage')"),
    ("exit 0\n", "succeeded but printed no CNI result"),
    ("echo '[1,2]'\n", "succeeded but printed no CNI result"),
])
def test_delegate_misbehaving_becomes_cni_error(node, script, expect):
    write_delegate(node.bin, "bridge", "cat >/dev/null\n" + script)
    error = node.call("ADD").error()
    assert error["code"] == 999 and expect in error["msg"], error


def test_delegate_cni_error_is_passed_on(node):
    write_delegate(node.bin, "bridge", "cat >/dev/null\n"
                   "echo '{\"code\":11,\"msg\":\"busy\",\"details\":\"later\"}'; exit 1\n")
    error = node.call("ADD").error()
    assert (error["code"], error["msg"], error["details"]) == (11, "busy", "later")
    assert error["cniVersion"] == "1.0.0"


def test_delegate_that_does_not_read_its_config(node):
    write_delegate(node.bin, "bridge", f"printf '%s' '{RESULT}'\n")
    answer = node.call("ADD")
    assert answer.code == 0 and answer.doc["ips"][0]["address"] == "10.1.17.2/24"


# ---- item 7 -------------------------------------------------------------------------------

def test_nested_data_dir_parents_are_0700(node):
    data_dir = node.tmp / "a" / "b" / "c"
    assert node.call("ADD", node.conf(dataDir=str(data_dir))).code == 0
    for directory in (node.tmp / "a", node.tmp / "a" / "b", data_dir):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE((data_dir / "c1").stat().st_mode) == 0o600


@pytest.mark.parametrize(("ifname", "problem"), [
    ("eth0123456789012", "is too long"), ("é" * 8, "is too long"), ("..", "is . or .."),
    ("eth:0", "contains / or : or whitespace"), ("a b", "contains / or : or whitespace")])
def test_invalid_ifname_is_code_4_before_saving(node, ifname, problem):
    answer = run_plugin(node.conf(), {**node.env("ADD"), "CNI_IFNAME": ifname})
    error = answer.error()
    assert error["code"] == 4 and problem in error["msg"], error
    assert node.files() == []


def test_fifteen_byte_ifname_is_accepted(node):
    answer = run_plugin(node.conf(), {**node.env("ADD"), "CNI_IFNAME": "eth012345678901"})
    assert answer.code == 0, answer


@pytest.mark.parametrize(("stdin", "code", "version"), [
    (b"", 0, "1.1.0"), (b'{"cniVersion":"0.3.1"}', 0, "0.3.1"), (b"{}", 0, "1.1.0"),
    (b'{"cniVersion":"9.9.9"}', 1, None), (b'{"cniVersion":1}', 6, None), (b"[]", 6, None)])
def test_version_validates_the_requested_version(stdin, code, version):
    answer = run_plugin(stdin, {"CNI_COMMAND": "VERSION"})
    if code == 0:
        assert answer.code == 0 and answer.doc["cniVersion"] == version
        assert answer.doc["supportedVersions"][0] == "0.1.0"
    else:
        assert answer.error()["code"] == code


@pytest.mark.parametrize(("command", "version"), [("CHECK", "0.3.1"), ("GC", "1.0.0")])
def test_commands_need_a_version_that_has_them(node, command, version):
    error = node.call(command, node.conf(cniVersion=version)).error()
    assert error["code"] == 1 and f"does not allow {command}" in error["msg"]


# ---- issue 9 item 8: the scratch file and dataDir -----------------------------------------

def test_symlink_at_the_temp_name_is_not_followed(node):
    victim = node.tmp / "victim"
    victim.write_text("precious")
    victim.chmod(0o644)
    node.data_dir.mkdir(mode=0o700)
    plant = (f"import os; os.symlink({str(victim)!r}, "
             f"os.path.join({str(node.data_dir)!r}, '.%d.tmp' % os.getpid())); ")
    answer = run_plugin(node.conf(), node.env("ADD"), before=plant)
    assert answer.code == 0, answer
    assert victim.read_text() == "precious"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert node.files() == ["c1"] and not (node.data_dir / "c1").is_symlink()


def test_symlink_at_the_saved_name_is_replaced_not_followed(node):
    victim = node.tmp / "victim"
    victim.write_text("precious")
    node.data_dir.mkdir(mode=0o700)
    (node.data_dir / "c1").symlink_to(victim)
    assert node.call("ADD").code == 0
    assert victim.read_text() == "precious"
    assert not (node.data_dir / "c1").is_symlink() and node.saved()["type"] == "bridge"


def test_saved_config_that_is_a_symlink_is_not_read_on_del(node):
    victim = node.tmp / "victim"
    victim.write_text('{"type":"bridge","name":"cbr0"}')
    node.data_dir.mkdir(mode=0o700)
    (node.data_dir / "c1").symlink_to(victim)
    answer = node.call("DEL")
    assert answer.code == 0 and answer.stdout == b""
    assert "is a symbolic link" in answer.stderr
    assert not (node.bin / "bridge.DEL.in").exists() and victim.exists()
    assert node.files() == []


def test_world_writable_data_dir_is_refused(node):
    node.data_dir.mkdir()
    node.data_dir.chmod(0o777)
    error = node.call("ADD").error()
    assert error["code"] == 5
    assert f"dataDir {node.data_dir} may be written by others (mode 0777" in error["msg"]
    assert f"chmod 0700 {node.data_dir}" in error["msg"]
    assert node.files() == []


def test_symlinked_data_dir_in_a_shared_directory_is_refused(node):
    shared = node.tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    real = node.tmp / "real"
    real.mkdir(mode=0o700)
    (shared / "data").symlink_to(real)
    error = node.call("ADD", node.conf(dataDir=str(shared / "data"))).error()
    assert error["code"] == 5 and "is a symbolic link in a directory others may write" \
        in error["msg"]
    assert list(real.iterdir()) == []


def test_symlinked_data_dir_placed_by_root_is_followed(node):
    real = node.tmp / "real"
    real.mkdir(mode=0o700)
    (node.tmp / "data").symlink_to(real)
    assert node.call("ADD").code == 0
    assert [p.name for p in real.iterdir()] == ["c1"]


def test_temp_file_is_removed_when_saving_fails(node):
    (node.data_dir / "c1").mkdir(parents=True)
    (node.data_dir / "c1" / "x").write_text("")
    node.data_dir.chmod(0o700)
    error = node.call("ADD").error()
    assert error["code"] == 5 and "failed to save the delegate config for c1" in error["msg"]
    assert node.files() == ["c1"]


# ---- Python 3.9 and 3.13 ------------------------------------------------------------------

@pytest.mark.parametrize("version", ["3.9.18", "3.13.0"])
def test_plugin_runs_on_other_pythons(node, version):
    python = pyenv_python(version)
    if python is None:
        pytest.skip(f"pyenv has no Python {version}")
    assert node.call("ADD", python=python).code == 0
    assert node.saved()["mtu"] == 1472
    assert node.call("ADD", b"{", python=python).error()["code"] == 6
    assert node.call("ADD", b"[" * 5000, python=python).error()["code"] == 6
    assert node.call("DEL", python=python).code == 0 and node.files() == []
    answer = run_plugin(b'{"cniVersion":"0.4.0"}', {"CNI_COMMAND": "VERSION"}, python=python)
    assert answer.doc["cniVersion"] == "0.4.0"


def test_add_and_del_stay_on_the_light_import_path(node):
    report = ("import atexit; atexit.register(lambda: sys.stderr.write('heavy=%s' % sorted("
              "m for m in ('json', 're', 'ipaddress', 'subprocess', 'select', 'enum') "
              "if m in sys.modules))); ")
    for command in ("ADD", "DEL"):
        answer = run_plugin(node.conf(), node.env(command), before=report)
        assert answer.code == 0 and answer.stderr.endswith("heavy=[]"), answer
