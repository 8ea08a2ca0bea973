"""flanneld flags: Go flag syntax, FLANNELD_* fallbacks, and errors that name the flag."""

import dataclasses

import pytest

from flannel.cli import main
from flannel.flags import FLAGS, UsageError, parse_args, parse_go_duration
from flannel.settings import EtcdSettings, KubeSettings


def parse(*argv, env=None):
    return parse_args(list(argv), environ=env or {})


def test_defaults_match_upstream():
    settings = parse()
    store = settings.store
    assert isinstance(store, EtcdSettings)
    assert store.endpoints == "http://127.0.0.1:4001,http://127.0.0.1:2379"
    assert store.prefix == "/coreos.com/network"
    assert settings.files.subnet_file == "/run/flannel/subnet.env"
    assert store.previous_subnet_file == "/run/flannel/subnet.env"
    assert store.renew_margin == 60 * 60
    assert settings.rules.resync == 5
    assert settings.rules.forward is True
    assert (settings.health.ip, settings.health.port) == ("0.0.0.0", 0)
    assert settings.interface.ifaces == () and settings.rules.ip_masq is False
    assert store.lease_ttl == 86400
    kube = parse("--kube-subnet-mgr").store
    assert isinstance(kube, KubeSettings)
    assert kube.annotation_prefix == "flannel.alpha.coreos.com"
    assert kube.set_node_network_unavailable is True
    assert kube.net_config_path == "/etc/kube-flannel/net-conf.json"


def test_settings_are_frozen():
    settings = parse("--ip-masq")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rules.ip_masq = False  # type: ignore[misc]


@pytest.mark.parametrize("argv", [
    ["-iface=eth0"], ["--iface=eth0"], ["--iface", "eth0"], ["-iface", "eth0"],
])
def test_go_flag_forms(argv):
    assert parse(*argv).interface.ifaces == ("eth0",)


def test_repeatable_iface_keeps_order():
    assert parse("--iface", "eth1", "-iface=10.0.0.1", "--iface=eth0").interface.ifaces == (
        "eth1", "10.0.0.1", "eth0")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--ip-masq"], True), (["--ip-masq=false"], False), (["-ip-masq=true"], True),
    (["--ip-masq=0"], False), (["--ip-masq=T"], True), ([], False),
])
def test_bool_forms(argv, expected):
    assert parse(*argv).rules.ip_masq is expected


def test_klog_flags():
    log = parse("-v=2", "-vmodule=x=1").log
    assert log.v == 2 and log.vmodule == "x=1"


def test_env_fallback_and_precedence():
    env = {"FLANNELD_ETCD_ENDPOINTS": "http://10.0.0.1:2379", "FLANNELD_IFACE": "eth9",
           "FLANNELD_IP_MASQ": "true", "FLANNELD_PUBLIC_IP": "", "FLANNELD_V": "3"}
    settings = parse("--etcd-endpoints=http://127.0.0.1:1", env=env)
    assert settings.store.endpoints == "http://127.0.0.1:1"  # command line wins
    assert settings.interface.ifaces == ("eth9",)  # one value from env for a repeatable flag
    assert settings.rules.ip_masq is True and settings.log.v == 3
    assert settings.interface.public_ip == ""  # empty env values are ignored


def test_every_flag_has_an_env_name():
    names = {flag.env_name for flag in FLAGS}
    assert {"FLANNELD_ETCD_ENDPOINTS", "FLANNELD_KUBE_SUBNET_MGR", "FLANNELD_IP_MASQ",
            "FLANNELD_SUBNET_LEASE_RENEW_MARGIN", "FLANNELD_LOG_BACKTRACE_AT"} <= names


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--bogus"], {}, "--bogus"),
    (["--healthz-port=abc"], {}, "healthz-port"),
    (["--ip-masq=maybe"], {}, "ip-masq"),
    (["extra"], {}, "extra"),
    ([], {"FLANNELD_HEALTHZ_PORT": "x"}, "FLANNELD_HEALTHZ_PORT"),
    (["--subnet-lease-ttl=soon"], {}, "subnet-lease-ttl"),
])
def test_bad_input_names_the_flag(argv, env, needle):
    with pytest.raises(UsageError, match=needle):
        parse(*argv, env=env)


def test_main_exits_nonzero_on_unknown_flag(capsys):
    assert main(["--no-such-flag"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_version_goes_to_stderr_and_ignores_env(capsys, monkeypatch):
    monkeypatch.setenv("FLANNELD_VERSION", "true")
    assert main(["--version"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip()
    assert parse(env={"FLANNELD_VERSION": "true"}).version is False


@pytest.mark.parametrize("flag", ["--help", "-help", "-h"])
def test_help_exits_zero(capsys, flag):
    """Every spelling Go's flag package takes (docker run IMAGE -help reaches flanneld)."""
    with pytest.raises(SystemExit) as caught:
        parse(flag)
    assert caught.value.code == 0
    assert "usage: flanneld [OPTION]..." in capsys.readouterr().out


@pytest.mark.parametrize(("text", "seconds"), [
    ("24h", 86400), ("1h30m", 5400), ("90s", 90), ("1.5h", 5400), ("0", 0)])
def test_durations(text, seconds):
    assert parse_go_duration(text) == seconds


GIVE_ADDRESS = "give this node's address on the network between the nodes"


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--iptables-resync=0"], {},
     "--iptables-resync=0: out of acceptable range; give seconds from 1 to 86400"),
    (["--iptables-resync=-5"], {},
     "--iptables-resync=-5: out of acceptable range; give seconds from 1 to 86400"),
    ([], {"FLANNELD_IPTABLES_RESYNC": "0"},
     "--iptables-resync=0 (from FLANNELD_IPTABLES_RESYNC): out of acceptable range; give "
     "seconds from 1 to 86400"),
    (["--healthz-port=65536"], {},
     "--healthz-port=65536: out of acceptable range; give a port from 0 to 65535 (0 turns "
     "the health server off)"),
    (["--healthz-port=-1"], {},
     "--healthz-port=-1: out of acceptable range; give a port from 0 to 65535 (0 turns "
     "the health server off)"),
    (["--subnet-lease-renew-margin=0"], {},
     "--subnet-lease-renew-margin=0: out of acceptable range; give minutes from 1 to 1439"),
    (["--subnet-lease-renew-margin=1440"], {},
     "--subnet-lease-renew-margin=1440: out of acceptable range; give minutes from 1 to "
     "1439"),
    (["--reconcile-interval=0"], {},
     "--reconcile-interval=0: out of acceptable range; give seconds from 1 to 86400"),
    (["-v=2147483648"], {}, "-v=2147483648: out of acceptable range; give a log level from "
     "-2147483648 to 2147483647"),
    (["--subnet-lease-ttl=30m"], {},
     "--subnet-lease-ttl=1800s: must be longer than --subnet-lease-renew-margin (60 min), or "
     "the lease would be renewed continuously"),
    (["--subnet-lease-ttl=0"], {},
     "--subnet-lease-ttl=0s: must be longer than --subnet-lease-renew-margin (60 min), or "
     "the lease would be renewed continuously"),
    (["--subnet-lease-ttl=9000000001s"], {},
     "--subnet-lease-ttl=9000000001s: longer than etcd allows; give at most 9000000000s"),
    (["--subnet-lease-ttl=" + "9" * 400 + "h"], {},
     "--subnet-lease-ttl=infs: longer than etcd allows; give at most 9000000000s"),
    (["--subnet-lease-ttl=90000.5s"], {},
     "--subnet-lease-ttl=90000.5s: etcd leases last whole seconds; give a whole number of "
     "seconds, such as 24h or 90000s"),
    (["--public-ip=0.0.0.0"], {},
     f"--public-ip=0.0.0.0: the unspecified address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ip=127.0.0.2"], {},
     f"--public-ip=127.0.0.2: a loopback address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ip=239.1.1.1"], {},
     f"--public-ip=239.1.1.1: a multicast address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ip=169.254.3.4"], {},
     f"--public-ip=169.254.3.4: a link-local address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ip=255.255.255.255"], {},
     f"--public-ip=255.255.255.255: the broadcast address, which other nodes cannot "
     f"reach; {GIVE_ADDRESS}"),
    (["--public-ip=node1"], {}, f"--public-ip=node1: not an IPv4 address; {GIVE_ADDRESS}"),
    (["--public-ip=fd00::1"], {},
     "--public-ip=fd00::1: an IPv6 address; give it with --public-ipv6"),
    ([], {"FLANNELD_PUBLIC_IP": "0.0.0.0"},
     f"--public-ip=0.0.0.0 (from FLANNELD_PUBLIC_IP): the unspecified address, which other "
     f"nodes cannot reach; {GIVE_ADDRESS}"),
    (["--public-ipv6=::"], {},
     f"--public-ipv6=::: the unspecified address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ipv6=::1"], {},
     f"--public-ipv6=::1: a loopback address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ipv6=ff02::1"], {},
     f"--public-ipv6=ff02::1: a multicast address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ipv6=fe80::1"], {},
     f"--public-ipv6=fe80::1: a link-local address, which other nodes cannot reach; "
     f"{GIVE_ADDRESS}"),
    (["--public-ipv6=fd00::1%eth0"], {},
     f"--public-ipv6=fd00::1%eth0: an address with a zone index, which other nodes cannot "
     f"reach; {GIVE_ADDRESS}"),
    (["--public-ipv6=10.0.0.1"], {},
     "--public-ipv6=10.0.0.1: an IPv4 address; give it with --public-ip"),
    (["--public-ipv6=::ffff:10.0.0.1"], {},
     "--public-ipv6=::ffff:10.0.0.1: an IPv4-mapped address; give the IPv4 address with "
     "--public-ip"),
    (["--healthz-ip=localhost"], {},
     "--healthz-ip=localhost: not an IP address; give the address to listen on, such as "
     "127.0.0.1, or 0.0.0.0 for every address"),
    (["--healthz-ip="], {},
     "--healthz-ip=: not an IP address; give the address to listen on, such as 127.0.0.1, "
     "or 0.0.0.0 for every address"),
    # A value of the wrong kind: the reason, not argparse's "invalid convert value".
    (["--subnet-lease-ttl=999999999999"], {},
     "argument -subnet-lease-ttl/--subnet-lease-ttl: '999999999999' is not a duration such "
     "as 24h, 90m or 3600s"),
    (["--iptables-resync=abc"], {},
     "argument -iptables-resync/--iptables-resync: 'abc' is not an integer"),
    (["--ip-masq=maybe"], {},
     "argument -ip-masq/--ip-masq: 'maybe' is not a boolean (use true or false)"),
    ([], {"FLANNELD_IPTABLES_RESYNC": "abc"},
     "FLANNELD_IPTABLES_RESYNC='abc': invalid value for --iptables-resync: 'abc' is not an "
     "integer"),
])
def test_values_that_hurt_are_refused_with_the_flag_and_range(argv, env, message):
    with pytest.raises(UsageError) as caught:
        parse(*argv, env=env)
    assert str(caught.value) == message


@pytest.mark.parametrize("argv", [
    ["--public-ip=192.0.2.10", "--public-ipv6=2001:db8::10"],
    ["--public-ip=10.1.2.3", "--healthz-ip=::1", "--healthz-port=65535"],
    ["--iptables-resync=1", "--reconcile-interval=86400", "-v=10"], ["-v=11"], ["-v=-1"],
    ["--subnet-lease-ttl=61m", "--subnet-lease-renew-margin=60"],
    ["--subnet-lease-ttl=9000000000s", "--subnet-lease-renew-margin=1439"],
])
def test_sensible_values_pass(argv):
    parse(*argv)


def test_effective_options_name_their_source_and_mask_secrets():
    env = {"FLANNELD_ETCD_PASSWORD": "s3cret", "FLANNELD_IPTABLES_RESYNC": "7",
           "FLANNELD_ETCD_PREFIX": "/from/env"}
    settings = parse("--etcd-prefix=/from/flag", "--iface=eth0", "--iface=eth1",
                     "--etcd-endpoints=https://flannel:pw@10.0.0.1:2379,http://10.0.0.2:2379",
                     "--kube-api-url=https://t0ken@api:6443", env=env)
    options = {o.name: (o.shown, o.source) for o in settings.options}
    assert "version" not in options
    assert options["etcd-prefix"] == ("/from/flag", "flag")  # the flag wins over the env
    assert options["iptables-resync"] == ("7", "FLANNELD_IPTABLES_RESYNC")
    assert options["etcd-password"] == ("*****", "FLANNELD_ETCD_PASSWORD")
    assert options["etcd-endpoints"] == (
        "https://flannel:*****@10.0.0.1:2379,http://10.0.0.2:2379", "flag")
    assert options["kube-api-url"] == ("https://*****@api:6443", "flag")
    assert options["iface"] == ("eth0,eth1", "flag")
    assert options["ip-masq"] == ("false", "default")
    assert options["subnet-lease-ttl"] == ("24h0m0s", "default")
    assert options["etcd-keyfile"] == ("", "default")
    assert [o.name for o in settings.options] == [f.name for f in FLAGS if f.name != "version"]
    shown = repr(settings.options)
    assert "s3cret" not in shown and ":pw@" not in shown and "t0ken" not in shown


def test_encap_peers_only_is_off_by_default_and_set_by_flag_or_environment():
    assert parse().rules.encap_peers_only is False
    assert parse("--encap-peers-only").rules.encap_peers_only is True
    assert parse(env={"FLANNELD_ENCAP_PEERS_ONLY": "true"}).rules.encap_peers_only is True
    assert parse("--encap-peers-only=false",
                 env={"FLANNELD_ENCAP_PEERS_ONLY": "true"}).rules.encap_peers_only is False
    with pytest.raises(UsageError, match="FLANNELD_ENCAP_PEERS_ONLY"):
        parse(env={"FLANNELD_ENCAP_PEERS_ONLY": "maybe"})


def test_help_describes_flanneld_and_shows_each_default(tmp_path):
    import subprocess

    from tests.support.checkout import FLANNELD

    result = subprocess.run([*FLANNELD, "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps to the terminal's width
    assert "flanneld runs on every host of a flannel network." in text
    assert "It needs root, or CAP_NET_ADMIN and CAP_NET_RAW." in text
    for flag, default in (("iptables-resync N", "5"), ("subnet-lease-ttl DURATION", "24h0m0s"),
                          ("ip-masq [BOOL]", "false"), ("iptables-forward-rules [BOOL]", "true"),
                          ("etcd-prefix VALUE", "/coreos.com/network"),
                          ("iface VALUE", "none")):
        name = flag.split()[0]
        env = "FLANNELD_" + name.upper().replace("-", "_")
        assert f"--{flag} " in text and f"(default {default}; env {env})" in text, flag
    # Go's flag syntax still parses as before.
    settings = parse("-iface=eth1", "--ip-masq=false", "-iptables-resync", "7")
    assert settings.interface.ifaces == ("eth1",)
    assert (settings.rules.ip_masq, settings.rules.resync) == (False, 7)


def test_unknown_flanneld_variables_are_named_with_the_nearest_flag():
    from flannel.flags import unknown_environment

    settings = parse(env={"FLANNELD_IP_MASK": "true", "FLANNELD_IFACE": "eth0",
                          "FLANNELD_FROBNICATE": "1", "FLANNEL_IFACE": "x"})
    assert settings.rules.ip_masq is False
    assert settings.warnings == (
        "environment variable FLANNELD_FROBNICATE is no flag's and is ignored; every flag's "
        "variable is FLANNELD_ and its name in capitals, with _ for - (--etcd-endpoints is "
        "FLANNELD_ETCD_ENDPOINTS)",
        "environment variable FLANNELD_IP_MASK is no flag's and is ignored; did you mean "
        "FLANNELD_IP_MASQ?")
    assert unknown_environment({f.env_name: "x" for f in FLAGS}) == ()


@pytest.mark.parametrize(("argv", "message"), [
    (["--iface"], "argument -iface/--iface: expected one argument"),
    (["--iface", "--ip-masq"], "argument -iface/--iface: expected one argument"),
    (["--ip-masq", "maybe"], "argument -ip-masq/--ip-masq: 'maybe' is not a boolean (use true "
                             "or false)"),
    (["--bogus=1", "stray", "--also"], "unrecognized arguments: --bogus=1 stray --also"),
    (["--", "--ip-masq"], "unrecognized arguments: -- --ip-masq"),
    # Go's flag package refuses it too (argparse took it for -v=2).
    (["-v2"], "unrecognized arguments: -v2"),
])
def test_command_line_mistakes_are_refused_as_argparse_words_them(argv, message):
    """flanneld scans its flags itself (argparse is loaded only for --help), with argparse's
    messages, which scripts and the lab's --flanneld-arg checks already read."""
    with pytest.raises(UsageError) as caught:
        parse(*argv)
    assert str(caught.value) == message


@pytest.mark.parametrize(("argv", "resync", "masq", "v"), [
    (["--ip-masq", "false", "-iptables-resync", "9"], 9, False, 0),
    (["--ip-masq", "-v", "-3"], 5, True, -3),  # a negative number is a value, as in argparse
    (["-iptables-resync=1", "--iptables-resync", "2"], 2, False, 0),  # the last one counts
])
def test_values_follow_their_flag_or_its_equals_sign(argv, resync, masq, v):
    settings = parse(*argv)
    assert (settings.rules.resync, settings.rules.ip_masq, settings.log.v) == (resync, masq, v)


def test_an_idle_flanneld_parses_its_flags_without_argparse():
    import subprocess
    import sys

    probe = ("import sys; from flannel import flags; "
             "flags.parse_args(['--ip-masq', '--iface=eth0', '-v=2'], {}); "
             "print(sorted({'argparse', 'shutil', 'gettext'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"
