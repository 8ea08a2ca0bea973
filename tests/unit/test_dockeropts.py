"""mk-docker-opts: the golden output of the compat reference, section 9."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flannel.dockeropts import main, render

MK_DOCKER_OPTS = str(Path(sys.executable).parent / "mk-docker-opts")

SAMPLE = {"FLANNEL_NETWORK": "10.1.0.0/16", "FLANNEL_SUBNET": "10.1.74.1/24",
          "FLANNEL_MTU": "1472", "FLANNEL_IPMASQ": "false"}
GOLDEN = ['DOCKER_OPT_BIP="--bip=10.1.74.1/24"', 'DOCKER_OPT_IPMASQ="--ip-masq=true"',
          'DOCKER_OPT_MTU="--mtu=1472"',
          'DOCKER_OPTS=" --bip=10.1.74.1/24 --ip-masq=true --mtu=1472"']


def out(**kwargs) -> list[str]:
    options = {"individual": False, "combined": False, "no_ipmasq": False,
               "key": "DOCKER_OPTS", "existing": ""}
    options.update(kwargs)
    return render(SAMPLE, **options).splitlines()


def test_golden_default():
    assert out() == GOLDEN


def test_individual_combined_key_and_no_masq():
    assert out(individual=True) == GOLDEN[:3]
    assert out(combined=True) == GOLDEN[3:]
    assert out(combined=True, key="CUSTOM_KEY") == [GOLDEN[3].replace("DOCKER_OPTS",
                                                                      "CUSTOM_KEY")]
    assert out(no_ipmasq=True) == [GOLDEN[0], GOLDEN[2],
                                   'DOCKER_OPTS=" --bip=10.1.74.1/24 --mtu=1472"']
    assert out(combined=True, existing="--debug")[0] == \
        'DOCKER_OPTS="--debug --bip=10.1.74.1/24 --ip-masq=true --mtu=1472"'


def test_ipmasq_true_disables_docker_masquerade():
    assert 'DOCKER_OPT_IPMASQ="--ip-masq=false"' in render(
        {**SAMPLE, "FLANNEL_IPMASQ": "true"}, individual=True, combined=False,
        no_ipmasq=False, key="DOCKER_OPTS", existing="")


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


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([MK_DOCKER_OPTS, *argv], capture_output=True, text=True, timeout=30,
                          check=False, env={"PATH": os.environ.get("PATH", "")})


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


def test_input_that_is_not_a_regular_file_is_refused(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["-f", str(fifo), "-d", str(tmp_path / "out.env")]) == 1
    assert capsys.readouterr().err == (f"mk-docker-opts: cannot read {fifo}: not a regular "
                                       "file; give the subnet.env flanneld writes\n")


def test_bad_combined_key_is_refused(tmp_path, capsys):
    assert main(["-k", "A B", "-d", str(tmp_path / "out.env")]) == 1
    assert capsys.readouterr().err == ("mk-docker-opts: -k 'A B': not a variable name; use "
                                       "letters, digits and '_', such as DOCKER_OPTS\n")
