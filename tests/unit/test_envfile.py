"""subnet.env: the vectors of the compat reference, section 5."""

import os
import stat
from ipaddress import IPv4Network, IPv6Network

from flannel.subnet.envfile import (
    SubnetEnv,
    cidrs_of,
    parse_dotenv,
    read_env,
    single_cidr,
    write_subnet_env,
)

ENV = SubnetEnv(IPv4Network("10.5.0.0/16"), IPv4Network("10.5.72.0/24"), None, None, 1450, False)


def test_running_md_vector(tmp_path):
    path = tmp_path / "run" / "flannel" / "subnet.env"
    env = SubnetEnv(IPv4Network("10.5.0.0/16"), IPv4Network("10.5.72.0/24"), None, None,
                    1450, False)
    old_umask = os.umask(0o077)
    try:
        write_subnet_env(path, env)
    finally:
        os.umask(old_umask)
    assert path.read_text() == ("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.72.1/24\n"
                                "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert [p.name for p in path.parent.iterdir()] == ["subnet.env"]


def test_dual_stack_order():
    env = SubnetEnv(IPv4Network("10.1.0.0/16"), IPv4Network("10.1.74.0/24"),
                    IPv6Network("2001:cafe:42::/56"), IPv6Network("2001:cafe:42::/64"), 1472, True)
    assert env.render() == (
        "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.74.1/24\n"
        "FLANNEL_IPV6_NETWORK=2001:cafe:42::/56\nFLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\n"
        "FLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n")


def test_ipv6_only():
    env = SubnetEnv(None, None, IPv6Network("fc00::/48"), IPv6Network("fc00:0:0:5::/64"),
                    1450, False)
    assert env.render().splitlines()[:2] == ["FLANNEL_IPV6_NETWORK=fc00::/48",
                                             "FLANNEL_IPV6_SUBNET=fc00:0:0:5::1/64"]


def test_rewrite_replaces_atomically(tmp_path):
    path = tmp_path / "subnet.env"
    path.write_text("old")
    inode = path.stat().st_ino
    write_subnet_env(path, SubnetEnv(IPv4Network("10.1.0.0/16"), IPv4Network("10.1.74.0/24"),
                                     None, None, 1472, False))
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert "FLANNEL_SUBNET=10.1.74.1/24" in path.read_text()


def test_reading_back_masks_and_skips_garbage():
    values = parse_dotenv("FLANNEL_SUBNET=10.244.1.0/24,not-a-cidr,10.244.2.0/24\n")
    assert cidrs_of(values, "FLANNEL_SUBNET") == [IPv4Network("10.244.1.0/24"),
                                                  IPv4Network("10.244.2.0/24")]
    assert single_cidr(values, "FLANNEL_SUBNET", 4) is None
    assert single_cidr(parse_dotenv("FLANNEL_SUBNET=not-a-cidr"), "FLANNEL_SUBNET", 4) is None
    assert single_cidr(parse_dotenv("FLANNEL_SUBNET=10.5.72.1/24"), "FLANNEL_SUBNET", 4) == \
        IPv4Network("10.5.72.0/24")


def test_dotenv_syntax():
    values = parse_dotenv('# comment\nexport A="x y"\nB=\'q\'\nC=v # trailing\nnoequals\n')
    assert values == {"A": "x y", "B": "q", "C": "v"}


def test_missing_file_reads_as_empty(tmp_path):
    assert read_env(tmp_path / "absent.env") == {}


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_previous_file_with_bad_bytes_and_garbage_keeps_what_parses(tmp_path, caplog):
    path = tmp_path / "subnet.env"
    path.write_bytes(b"FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.72.1/24\n"
                     b"FLANNEL_\xff\xfeMTU=1450\n{garbage}\n=nokey\n# note\n\nFLANNEL_IPMASQ=true")
    assert read_env(path) == {"FLANNEL_NETWORK": "10.5.0.0/16",
                              "FLANNEL_SUBNET": "10.5.72.1/24", "FLANNEL_IPMASQ": "true"}
    assert warnings_of(caplog) == [
        f"ignoring 3 line(s) of {path} that are not UTF-8 KEY=value (line 3, 4, 5)"]


def test_directory_at_the_path_reads_as_absent(tmp_path, caplog):
    path = tmp_path / "subnet.env"
    path.mkdir()
    assert read_env(path) == {}
    assert warnings_of(caplog) == [
        f"ignoring the previous {path}: Is a directory; a new subnet may be chosen"]


def test_fifo_at_the_path_does_not_block(tmp_path, caplog):
    path = tmp_path / "subnet.env"
    os.mkfifo(path)
    assert read_env(path) == {}
    assert warnings_of(caplog) == [
        f"ignoring the previous {path}: Not a regular file but a FIFO; a new subnet may be "
        "chosen"]


def test_unreadable_file_reads_as_absent(tmp_path, caplog):
    path = tmp_path / "subnet.env"
    path.symlink_to(path)  # a loop: open fails with ELOOP whoever runs the test
    assert read_env(path) == {}
    assert warnings_of(caplog) == [f"ignoring the previous {path}: Too many levels of "
                                   "symbolic links; a new subnet may be chosen"]


def test_huge_file_is_read_up_to_the_limit(tmp_path, caplog):
    from flannel.subnet.envfile import MAX_ENV_BYTES

    path = tmp_path / "subnet.env"
    path.write_bytes(b"FLANNEL_SUBNET=10.5.72.1/24\nPAD=" + b"x" * (10 * MAX_ENV_BYTES))
    assert read_env(path) == {"FLANNEL_SUBNET": "10.5.72.1/24"}
    assert warnings_of(caplog) == [f"{path} is larger than 65536 bytes; ignoring the rest"]


def test_write_replaces_a_symlink_at_the_path_without_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "subnet.env"
    path.symlink_to(victim)
    write_subnet_env(path, SubnetEnv(IPv4Network("10.1.0.0/16"), IPv4Network("10.1.74.0/24"),
                                     None, None, 1472, False))
    assert victim.read_text() == "keep"
    assert not path.is_symlink() and "FLANNEL_SUBNET=10.1.74.1/24" in path.read_text()


def test_failed_write_leaves_no_temp_file(tmp_path):
    path = tmp_path / "subnet.env"
    path.mkdir()  # rename over a directory fails
    env = SubnetEnv(IPv4Network("10.1.0.0/16"), IPv4Network("10.1.74.0/24"), None, None, 1472,
                    False)
    try:
        write_subnet_env(path, env)
    except IsADirectoryError:
        pass
    else:
        raise AssertionError("writing over a directory must fail")
    assert [p.name for p in tmp_path.iterdir()] == ["subnet.env"]
    assert path.is_dir()


def test_a_directory_others_can_write_is_warned_about_once(tmp_path, caplog):
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(0o777)
    path = directory / "subnet.env"
    write_subnet_env(path, ENV)
    write_subnet_env(path, ENV)
    assert warnings_of(caplog) == [
        f"{path} can be replaced by other users: directory {directory} is writable by other "
        f"users (mode 0777): run `chmod go-w {directory}`; the CNI plugin builds every pod's "
        "network from it"]


def test_a_sticky_directory_and_a_private_one_are_not_warned_about(tmp_path, caplog):
    for mode in (0o1777, 0o755):
        directory = tmp_path / f"{mode:o}"
        directory.mkdir()
        directory.chmod(mode)
        write_subnet_env(directory / "subnet.env", ENV)
    assert warnings_of(caplog) == []
