"""mk-docker-opts: the golden output of the compat reference, section 9, and what upstream's
script (dist/mk-docker-opts.sh at v0.28.9) does with a missing file, a missing
FLANNEL_IPMASQ and DOCKER_OPT_* variables of the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flannel.optbin.dockeropts import main, render

MK_DOCKER_OPTS = str(Path(sys.executable).parent / "mk-docker-opts")

SAMPLE = {"FLANNEL_NETWORK": "10.1.0.0/16", "FLANNEL_SUBNET": "10.1.74.1/24",
          "FLANNEL_MTU": "1472", "FLANNEL_IPMASQ": "false"}
GOLDEN = ['DOCKER_OPT_BIP="--bip=10.1.74.1/24"', 'DOCKER_OPT_IPMASQ="--ip-masq=true"',
          'DOCKER_OPT_MTU="--mtu=1472"',
          'DOCKER_OPTS=" --bip=10.1.74.1/24 --ip-masq=true --mtu=1472"']


def out(variables: dict[str, str] = SAMPLE, **kwargs) -> list[str]:
    options = {"individual": False, "combined": False, "no_ipmasq": False,
               "key": "DOCKER_OPTS"}
    options.update(kwargs)
    return render(variables, **options).splitlines()


def test_golden_default():
    assert out() == GOLDEN


def test_individual_combined_key_and_no_masq():
    assert out(individual=True) == GOLDEN[:3]
    assert out(combined=True) == GOLDEN[3:]
    assert out(combined=True, key="CUSTOM_KEY") == [GOLDEN[3].replace("DOCKER_OPTS",
                                                                      "CUSTOM_KEY")]
    assert out(no_ipmasq=True) == [GOLDEN[0], GOLDEN[2],
                                   'DOCKER_OPTS=" --bip=10.1.74.1/24 --mtu=1472"']


def test_the_combined_key_value_comes_first_followed_by_a_space():
    """Upstream appends a space to the key's own value, then " option" for each option."""
    assert out({**SAMPLE, "DOCKER_OPTS": "--debug"}, combined=True) == [
        'DOCKER_OPTS="--debug  --bip=10.1.74.1/24 --ip-masq=true --mtu=1472"']
    assert out({"DOCKER_OPTS": "--debug"}, combined=True) == ['DOCKER_OPTS="--debug "']


def test_ipmasq_true_disables_docker_masquerade():
    assert 'DOCKER_OPT_IPMASQ="--ip-masq=false"' in out(
        {**SAMPLE, "FLANNEL_IPMASQ": "true"}, individual=True)


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([MK_DOCKER_OPTS, *argv], capture_output=True, text=True, timeout=30,
                          check=False, env={"PATH": os.environ.get("PATH", ""), **(env or {})})


def test_missing_flannel_env_file_writes_empty_options(tmp_path):
    """No subnet.env (flanneld not started yet): upstream writes an empty combined key and
    succeeds, so a docker unit ordered after it still starts."""
    dst = tmp_path / "docker_opts.env"
    result = run_cli("-f", str(tmp_path / "missing.env"), "-d", str(dst))
    assert (result.returncode, result.stderr) == (0, "")
    assert dst.read_text() == 'DOCKER_OPTS=""\n'


def test_missing_ipmasq_leaves_the_masquerade_option_out(tmp_path):
    src, dst = tmp_path / "subnet.env", tmp_path / "docker_opts.env"
    src.write_text("FLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\n")
    result = run_cli("-f", str(src), "-d", str(dst))
    assert (result.returncode, result.stderr) == (0, "")
    assert dst.read_text().splitlines() == [GOLDEN[0], GOLDEN[2],
                                            'DOCKER_OPTS=" --bip=10.1.74.1/24 --mtu=1472"']


def test_docker_opt_variables_of_the_environment_are_kept(tmp_path):
    """Every DOCKER_OPT_* variable is an option, in name order, flannel's own replacing one
    of the same name; the combined key's value from the environment comes first."""
    src, dst = tmp_path / "subnet.env", tmp_path / "docker_opts.env"
    src.write_text("".join(f"{k}={v}\n" for k, v in SAMPLE.items()))
    result = run_cli("-f", str(src), "-d", str(dst),
                     env={"DOCKER_OPT_DEBUG": "--debug", "DOCKER_OPT_A": "--a",
                          "DOCKER_OPT_A1": "--a1", "DOCKER_OPT_BIP": "--bip=1.2.3.4/24",
                          "DOCKER_OPTS": "--existing"})
    assert (result.returncode, result.stderr) == (0, "")
    assert dst.read_text().splitlines() == [
        'DOCKER_OPT_A="--a"', 'DOCKER_OPT_A1="--a1"', GOLDEN[0], 'DOCKER_OPT_DEBUG="--debug"',
        *GOLDEN[1:3],
        'DOCKER_OPTS="--existing  --a --a1 --bip=10.1.74.1/24 --debug --ip-masq=true '
        '--mtu=1472"']


def test_an_option_is_written_whole_and_only_docker_opt_names_count(tmp_path):
    """Unlike upstream's word-split ``set | grep DOCKER_OPT_`` loop: a value keeps its
    spaces, and a variable whose name merely contains DOCKER_OPT_ is no option."""
    dst = tmp_path / "docker_opts.env"
    result = run_cli("-f", str(tmp_path / "missing.env"), "-d", str(dst),
                     env={"DOCKER_OPT_LABELS": "--label a=1  --label b=2",
                          "MY_DOCKER_OPT_X": "--not-an-option"})
    assert (result.returncode, result.stderr) == (0, "")
    assert dst.read_text().splitlines() == [
        'DOCKER_OPT_LABELS="--label a=1  --label b=2"',
        'DOCKER_OPTS=" --label a=1  --label b=2"']


def test_the_file_wins_over_the_environment_and_fills_what_it_lacks(tmp_path):
    """Upstream sources the file over its environment: FLANNEL_* of the environment count
    where the file has none, and the file's DOCKER_OPT_* replace the environment's."""
    src, dst = tmp_path / "subnet.env", tmp_path / "docker_opts.env"
    src.write_text("FLANNEL_SUBNET=10.1.74.1/24\nDOCKER_OPT_X=--from-file\n")
    result = run_cli("-f", str(src), "-d", str(dst), "-i",
                     env={"FLANNEL_SUBNET": "10.9.9.1/24", "FLANNEL_IPMASQ": "true",
                          "DOCKER_OPT_X": "--from-env"})
    assert (result.returncode, result.stderr) == (0, "")
    assert dst.read_text().splitlines() == [GOLDEN[0], 'DOCKER_OPT_IPMASQ="--ip-masq=false"',
                                            'DOCKER_OPT_X="--from-file"']


@pytest.mark.parametrize(("name", "value"), [
    ("DOCKER_OPT_DEBUG", '--label="x"'), ("DOCKER_OPT_DEBUG", "$(reboot)"),
    ("DOCKER_OPTS", "--debug\nEVIL=1"), ("DOCKER_OPT_DEBUG", "a\\")])
def test_environment_values_that_cannot_be_quoted_are_refused(tmp_path, name, value):
    dst = tmp_path / "docker_opts.env"
    result = run_cli("-f", str(tmp_path / "missing.env"), "-d", str(dst), env={name: value})
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"mk-docker-opts: Invalid value of {name} in the environment: {value!r} cannot be "
        "written as a Docker option")
    assert not dst.exists()


def test_command_writes_the_file_and_rejects_bad_ipmasq(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DOCKER_OPTS", raising=False)
    src, dst = tmp_path / "subnet.env", tmp_path / "docker_opts.env"
    src.write_text("".join(f"{k}={v}\n" for k, v in SAMPLE.items()))
    assert main(["-f", str(src), "-d", str(dst)]) == 0
    assert dst.read_text().splitlines() == GOLDEN
    src.write_text(src.read_text().replace("FLANNEL_IPMASQ=false", "FLANNEL_IPMASQ=maybe"))
    assert main(["-f", str(src), "-d", str(dst)]) == 1
    assert "Invalid value of FLANNEL_IPMASQ: maybe" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["-h", "-?"])
def test_usage_exits_one(flag, capsys):
    assert main([flag]) == 1
    assert "Usage: mk-docker-opts" in capsys.readouterr().err


def test_non_utf8_input_is_refused_naming_the_file(tmp_path):
    src, dst = tmp_path / "subnet.env", tmp_path / "docker_opts.env"
    src.write_bytes(b"FLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=14\xff72\n")
    result = run_cli("-f", str(src), "-d", str(dst))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"mk-docker-opts: cannot read {src}: not UTF-8 text (byte 0xff "
                             "at offset 42); give the subnet.env flanneld writes\n")
    assert list(tmp_path.iterdir()) == [src]


@pytest.mark.parametrize(("target", "why"), [
    ("a-directory", "Is a directory"), ("a-file/docker_opts.env", "Not a directory")])
def test_unwritable_output_is_refused_naming_the_file(tmp_path, target, why):
    src = tmp_path / "subnet.env"
    src.write_text("".join(f"{k}={v}\n" for k, v in SAMPLE.items()))
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-file").write_text("keep\n")
    dst = tmp_path / target
    result = run_cli("-f", str(src), "-d", str(dst))
    assert result.returncode == 1
    assert result.stderr == (f"mk-docker-opts: cannot write {dst}: {why}; give -d a file in a "
                             "writable directory\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory", "a-file",
                                                          "subnet.env"]
    assert list((tmp_path / "a-directory").iterdir()) == []  # no temp file left behind
    assert (tmp_path / "a-file").read_text() == "keep\n"


def test_output_replaces_a_symlink_instead_of_following_it(tmp_path):
    src, victim, dst = tmp_path / "subnet.env", tmp_path / "victim", tmp_path / "out.env"
    src.write_text("".join(f"{k}={v}\n" for k, v in SAMPLE.items()))
    victim.write_text("keep\n")
    dst.symlink_to(victim)
    assert run_cli("-f", str(src), "-d", str(dst)).returncode == 0
    assert victim.read_text() == "keep\n"
    assert not dst.is_symlink() and dst.read_text().splitlines() == GOLDEN


@pytest.mark.parametrize(("line", "message"), [
    ('FLANNEL_SUBNET="10.1.74.1/24 $(reboot)"',
     "Invalid value of FLANNEL_SUBNET in {src}: '10.1.74.1/24 $(reboot)' is not an IPv4 "
     "address/prefix such as 10.1.74.1/24"),
    ("FLANNEL_MTU=1472x", "Invalid value of FLANNEL_MTU in {src}: '1472x' is not a number"),
])
def test_values_that_are_not_options_are_refused(tmp_path, capsys, line, message):
    src = tmp_path / "subnet.env"
    src.write_text("FLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n"
                   f"{line}\n")
    assert main(["-f", str(src), "-d", str(tmp_path / "out.env")]) == 1
    assert capsys.readouterr().err == f"mk-docker-opts: {message.format(src=src)}\n"
    assert not (tmp_path / "out.env").exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_input_that_is_not_a_regular_file_counts_as_missing(tmp_path, kind, monkeypatch):
    """As upstream's ``[ -f FILE ]``: nothing is read from it (a FIFO never blocks)."""
    monkeypatch.delenv("DOCKER_OPTS", raising=False)
    src, dst = tmp_path / "subnet.env", tmp_path / "out.env"
    if kind == "fifo":
        os.mkfifo(src)
    else:
        src.mkdir()
    assert main(["-f", str(src), "-d", str(dst)]) == 0
    assert dst.read_text() == 'DOCKER_OPTS=""\n'


def test_bad_combined_key_is_refused(tmp_path, capsys):
    assert main(["-k", "A B", "-d", str(tmp_path / "out.env")]) == 1
    assert capsys.readouterr().err == ("mk-docker-opts: -k 'A B': not a variable name; use "
                                       "letters, digits and '_', such as DOCKER_OPTS\n")
