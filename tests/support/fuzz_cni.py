"""Fuzz targets for the CNI plugin (shape: tests/support/fuzzing.py).

- "cni stdin+env": the real plugin executable in a fresh ``python -I -S`` process, with
  hostile stdin (bytes, broken JSON, netconfs with hostile values), environment and saved
  config (what DEL finds). It must answer a result (exit 0) or a valid CNI error object
  (non-zero exit), and write nothing in its sandbox outside the dataDir it was given. The
  delegate is a recording script in the sandbox: nothing touches the network.
- "cni subnet.env": the plugin's subnet.env reader on hostile bytes, in-process: it returns
  the parsed values or raises CniError.

One sandbox directory per process, created on first use and removed at exit; every run
removes the files it made, so thousands of runs stay fast and independent.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from flannel.cni.plugin import CniError, parse_subnet_env_data
from tests.support.cniexec import LAUNCH, ROOT, check_error_object
from tests.support.fuzzing import FuzzTarget

ENV_TEXT = "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\n" \
           "FLANNEL_IPMASQ=true\n"
RESULT = '{"cniVersion":"1.0.0","ips":[{"address":"10.1.17.2/24"}]}'
_sandbox: Path | None = None


def sandbox() -> Path:
    """This process's sandbox: subnet.env, a bin dir with recording delegates."""
    global _sandbox
    if _sandbox is None:
        root = Path(tempfile.mkdtemp(prefix="fuzz-cni-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        (root / "subnet.env").write_text(ENV_TEXT)
        (root / "bin").mkdir()
        for name in ("bridge", "host-local", "ptp"):
            script = root / "bin" / name
            script.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s' '{RESULT}'\n")
            script.chmod(0o755)
        _sandbox = root
    return _sandbox


# ---- strategies ---------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                     st.text(max_size=20), st.sampled_from([1400.0, 2**53 + 1, 1e300, -0.0]))
_json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)
_names = st.one_of(st.just("cbr0"), st.just("cbr0"), st.just("cbr0"), st.text(max_size=20),
                   _json_values)
_versions = st.one_of(st.sampled_from(["0.1.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "9.9.9",
                                       ""]), _json_values)
_routes = st.lists(st.one_of(st.fixed_dictionaries(
    {"dst": st.sampled_from(["10.96.0.5/12", "fd00::/64", "bogus", "10.0.0.0/33"])},
    optional={"gw": st.one_of(st.sampled_from(["10.1.17.20", "", "x"]), _json_values),
              "mtu": _json_values, "table": _json_values, "scope": st.integers()}),
    _json_values), max_size=3)
_delegates = st.one_of(_json_values, st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.sampled_from(["bridge", "ptp", "missing", "../bridge", ""]),
                      _json_values),
    "mtu": _json_values, "ipMasq": _json_values, "name": _json_values,
    "cniVersion": _json_values}))
_ipams = st.one_of(_json_values, st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.just("host-local"), _json_values), "routes": _routes}))
# A dataDir always inside the sandbox (the default /var/lib/cni/flannel must not be used):
# a suffix of hostile components, but never one that climbs out.
_suffixes = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1,
                             max_size=8).filter(lambda part: part not in (".", "..")
                                                and "/" not in part), max_size=3)
_data_dirs = st.one_of(_suffixes.map(lambda parts: ("path", parts)),
                       _suffixes.map(lambda parts: ("path", parts)),
                       _json_values.filter(lambda v: not isinstance(v, str))
                       .map(lambda value: ("value", value)))


_good = {
    "cniVersion": st.sampled_from(["0.1.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]),
    "delegate": st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["bridge", "ptp"]), "hairpinMode": st.booleans(),
        "mtu": st.sampled_from([1400, 1400.0, 9000, 2**53 + 1, 0.5])}),
    "ipam": st.fixed_dictionaries({"type": st.just("host-local")}, optional={
        "routes": st.lists(st.fixed_dictionaries(
            {"dst": st.sampled_from(["10.96.0.5/12", "fd00::/64"])},
            optional={"gw": st.sampled_from(["10.1.17.20", ""]),
                      "mtu": st.sampled_from([0, 1400, 1400.0]), "table": st.integers(0, 255)}),
            max_size=2)}),
    "runtimeConfig": st.one_of(st.none(), st.just({"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})),
}
_hostile = {"cniVersion": _versions, "delegate": _delegates, "ipam": _ipams,
            "runtimeConfig": _json_values, "subnetFile": _json_values}


@st.composite
def _netconfs(draw: st.DrawFn) -> bytes:
    conf: dict = {"type": "flannel", "name": draw(_names)}
    for key in ("cniVersion", "delegate", "ipam", "runtimeConfig", "subnetFile"):
        mode = draw(st.sampled_from(["absent", "good", "good", "hostile"]))
        if mode == "hostile":
            conf[key] = draw(_hostile[key])
        elif mode == "good" and key != "subnetFile":
            conf[key] = draw(_good[key])
    if "subnetFile" not in conf:
        conf["subnetFile"] = str(sandbox() / "subnet.env")
    kind, data_dir = draw(_data_dirs)
    conf["dataDir"] = "/".join([str(sandbox() / "data"), *data_dir]) if kind == "path" \
        else data_dir
    text = json.dumps(conf).encode()  # NaN and Infinity included
    cut = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, len(text))))
    return text if cut is None else text[:cut]  # truncated documents too


_env_values = st.one_of(st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                       blacklist_characters="\x00"),
                                min_size=1, max_size=30),
                        st.binary(min_size=1, max_size=30).filter(lambda b: b"\x00" not in b))
_stdins = st.one_of(st.binary(max_size=200),
                    st.integers(1, 5000).map(lambda depth: b"[" * depth),
                    st.sampled_from([b"", b"{", b'{"name":"cbr0","delegate":{"mtu":1e400}}']))


_saved_configs = st.one_of(
    st.binary(max_size=100),
    st.fixed_dictionaries({"type": st.one_of(st.sampled_from(["bridge", "missing", "../x"]),
                                             _json_values)},
                          optional={"name": _names, "cniVersion": _versions,
                                    "mtu": _json_values, "ipam": _ipams})
    .map(lambda doc: json.dumps(doc).encode()))


def _mostly(valid: list, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly one of ``valid`` (so that runs get past the first check); at times hostile or
    absent (None)."""
    return st.sampled_from([*valid, "<hostile>", None]).flatmap(
        lambda pick: hostile if pick == "<hostile>" else st.just(pick))


_cni_inputs = st.tuples(
    st.one_of(_netconfs(), _netconfs(), _netconfs(), _stdins),
    st.fixed_dictionaries({
        "CNI_COMMAND": _mostly(["ADD"] * 5 + ["DEL"] * 4 + ["CHECK", "VERSION", "GC",
                                                          "STATUS", ""], _env_values),
        "CNI_CONTAINERID": _mostly(["c1"] * 6 + ["pod-2"] * 3, _env_values),
        "CNI_IFNAME": _mostly(["eth0"] * 8, _env_values),
        "CNI_NETNS": _mostly(["/run/netns/fuzz"] * 8, _env_values),
        "CNI_ARGS": st.one_of(st.none(), _env_values),
    }).map(lambda env: {k: v for k, v in env.items() if v is not None}),
    st.sampled_from([True, True, True, False]),  # whether CNI_PATH names the delegates
    st.one_of(st.none(), _saved_configs))  # a saved config for c1, as DEL would find it


# ---- runs ---------------------------------------------------------------------------------

def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_cni(case: tuple[bytes, dict, bool, bytes | None]) -> None:
    stdin, env, with_path, saved = case
    root = sandbox()
    if saved is not None:
        (root / "data").mkdir(mode=0o700, exist_ok=True)
        (root / "data" / "c1").write_bytes(saved)
    full_env: dict = {"PATH": "/usr/bin:/bin", **env}
    if with_path:
        full_env["CNI_PATH"] = str(root / "bin")
    before = _tree(root)
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCH.format(root=ROOT,
                                                                        before="")],
                          input=stdin, env=full_env, capture_output=True, timeout=60,
                          check=False)
    try:
        made = {p for p in _tree(root) - before if not p.startswith("data")}
        assert not made, f"files written outside dataDir: {sorted(made)}"
        if proc.returncode == 0:
            command = env.get("CNI_COMMAND")
            if command in ("DEL", "CHECK", "GC", "STATUS"):
                assert proc.stdout == b"", proc.stdout
            else:
                doc = json.loads(proc.stdout)
                assert isinstance(doc, dict) and isinstance(doc.get("cniVersion"), str), doc
        else:
            assert proc.stdout.endswith(b"\n"), proc.stdout
            check_error_object(json.loads(proc.stdout))
    except (AssertionError, ValueError) as err:
        raise AssertionError(f"{err}\nstdin={stdin[:300]!r}\nenv={env!r}\nsaved={saved!r}\nexit="
                             f"{proc.returncode}\nstdout={proc.stdout[:500]!r}\nstderr="
                             f"{proc.stderr[-800:]!r}") from None
    finally:
        shutil.rmtree(root / "data", ignore_errors=True)
        for name in os.listdir(root):
            if name.startswith("data"):
                shutil.rmtree(root / name, ignore_errors=True)


_env_lines = st.lists(st.one_of(
    st.tuples(st.sampled_from([b"FLANNEL_NETWORK", b"FLANNEL_IPV6_NETWORK", b"FLANNEL_SUBNET",
                               b"FLANNEL_IPV6_SUBNET", b"FLANNEL_MTU", b"FLANNEL_IPMASQ",
                               b"#", b""]),
              st.one_of(st.binary(max_size=40), st.sampled_from(
                  [b"10.1.0.0/16", b"10.1.17.1/24", b"fc00::/48,fc00::/48", b"1472",
                   b"4294967296", b"true", b"10.1.0.0/99999", b"\xff\xfe", b"9" * 5000])))
    .map(lambda kv: kv[0] + b"=" + kv[1]),
    st.binary(max_size=60)), max_size=12)
_env_files = st.one_of(st.binary(max_size=400), _env_lines.map(
    lambda lines: b"\n".join(lines)), _env_lines.map(lambda lines: b"\r\n".join(lines)))


def run_subnet_env(data: bytes) -> None:
    try:
        env = parse_subnet_env_data(data, "subnet.env")
    except CniError as err:
        assert isinstance(err.code, int) and isinstance(err.msg, str)
        return
    assert isinstance(env["mtu"], int) and 0 <= env["mtu"] <= 0xFFFFFFFF
    assert isinstance(env["ipmasq"], bool)


TARGETS: list[FuzzTarget] = [
    FuzzTarget("cni stdin+env", _cni_inputs, run_cni),
    FuzzTarget("cni subnet.env", _env_files, run_subnet_env),
]
