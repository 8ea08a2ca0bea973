"""mk-docker-opts: the golden output of the compat reference, section 9."""

from __future__ import annotations

import pytest

from flannel.dockeropts import main, render

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
