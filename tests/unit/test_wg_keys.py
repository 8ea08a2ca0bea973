"""The WireGuard key file rules and key handling."""

import base64
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from flannel.wireguard.keys import (
    KeyFileError,
    Secret,
    generate_private_key,
    key_file_path,
    load_or_create_private_key,
    parse_key,
    public_key,
    read_key_file,
    x25519,
)
from tests.support.fifos import outcome_of_reading


def test_a_missing_key_file_is_created_0400_in_a_0700_directory(tmp_path):
    path = tmp_path / "flannel" / "wgkey"
    key, created = load_or_create_private_key(path)
    assert created
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert text == key.base64() and len(text) == 44 and not text.endswith("\n")
    again, created_again = load_or_create_private_key(path)
    assert again == key and not created_again


def test_an_existing_directory_keeps_its_mode(tmp_path):
    tmp_path.chmod(0o755)
    load_or_create_private_key(tmp_path / "wgkey")
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


def test_an_existing_key_made_by_wg_is_read(tmp_path):
    if shutil.which("wg") is None:
        pytest.skip("needs wireguard-tools")
    text = subprocess.run(["wg", "genkey"], capture_output=True, text=True,
                          check=True).stdout
    path = tmp_path / "wgkey"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, text.encode())  # with its newline, as `wg genkey > file` leaves it
    os.close(fd)
    key, created = load_or_create_private_key(path)
    assert not created and key.base64() == text.strip()
    pub = subprocess.run(["wg", "pubkey"], input=text, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert public_key(key) == pub


def test_a_key_file_readable_by_others_is_used_with_a_warning(tmp_path, caplog):
    path = tmp_path / "wgkey"
    key, _ = load_or_create_private_key(path)
    path.chmod(0o644)
    assert load_or_create_private_key(path) == (key, False)
    assert (f"WireGuard key file {path} has mode 0644, readable by other users; run "
            f"`chmod 0400 {path}`") in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_a_key_file_others_can_write_is_refused(tmp_path, mode):
    path = tmp_path / "wgkey"
    load_or_create_private_key(path)
    os.chown(path, 0, 1234)
    path.chmod(mode)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    assert str(err.value) == (f"WireGuard key file {path} has mode {mode:04o}, writable by "
                              f"other users; run `chmod 0400 {path}` (and consider the key "
                              "leaked)")


def secret_volume(root, mode=0o644):
    """A key as kubelet mounts a Secret: ``wgkey -> ..data/wgkey``, ``..data ->
    ..2024_05_01_12_00_00.123``, all root's, in a 1777 volume root."""
    root.mkdir()
    root.chmod(0o1777)
    timestamped = root / "..2024_05_01_12_00_00.123"
    timestamped.mkdir()
    timestamped.chmod(0o755)
    key = generate_private_key()
    (timestamped / "wgkey").write_text(key.base64())
    (timestamped / "wgkey").chmod(mode)
    (root / "..data").symlink_to(timestamped.name)
    (root / "wgkey").symlink_to("..data/wgkey")
    return root / "wgkey", key


def test_a_key_mounted_from_a_kubernetes_secret_is_used(tmp_path):
    path, key = secret_volume(tmp_path / "secret")
    assert load_or_create_private_key(path) == (key, False)


def test_a_secret_key_in_a_directory_others_can_write_is_refused(tmp_path):
    path, _ = secret_volume(tmp_path / "secret")
    timestamped = tmp_path / "secret" / "..2024_05_01_12_00_00.123"
    timestamped.chmod(0o777)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    assert str(err.value) == (
        f"WireGuard key file {path} could be replaced by another user: directory "
        f"{timestamped} is writable by other users (mode 0777): run `chmod go-w "
        f"{timestamped}`; keep the key where only root can change it")


@pytest.mark.skipif(os.geteuid() != 0, reason="lchown needs root")
def test_a_symlink_another_user_owns_is_refused(tmp_path):
    path, _ = secret_volume(tmp_path / "secret")
    os.lchown(tmp_path / "secret" / "..data", 1234, 1234)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    assert str(err.value) == (
        f"WireGuard key file {path} could be replaced by another user: "
        f"directory {tmp_path / 'secret'} is writable by other users (mode 1777): run "
        f"`chmod go-w {tmp_path / 'secret'}`; keep the key where only root can change it")


def test_a_root_owned_symlink_in_a_private_directory_is_followed(tmp_path):
    real = tmp_path / "real"
    key, _ = load_or_create_private_key(real)
    link = tmp_path / "wgkey"
    link.symlink_to(real)
    assert load_or_create_private_key(link) == (key, False)


def test_a_fifo_at_the_key_path_is_refused_at_once(tmp_path):
    """Opening a FIFO for reading waits for a writer: start-up would hang."""
    path = tmp_path / "wgkey"
    os.mkfifo(path, 0o600)
    outcome = [outcome_of_reading(path, lambda: _attempt(path), "the WireGuard key file")]
    assert outcome == [
        f"WireGuard key file {path} is a FIFO, not a regular file: remove it (flanneld then "
        "creates a key there) or set WIREGUARD_KEY_FILE to the key file"]


def _attempt(path):
    try:
        load_or_create_private_key(path)
    except KeyFileError as err:
        return str(err)
    return "accepted"


@pytest.mark.parametrize("content", [b"", b"not a key", b"\xff\xfe" * 22,
                                     base64.b64encode(bytes(31)), base64.b64encode(bytes(33)),
                                     b"A" * 5000])
def test_a_key_file_with_unparsable_content_is_refused_without_echoing_it(tmp_path, content):
    path = tmp_path / "wgkey"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    message = str(err.value)
    assert message.startswith(f"the content of WireGuard key file {path} is not a WireGuard "
                              "key: ") or message == (
        f"WireGuard key file {path} is not a WireGuard key: it is larger than 4096 bytes")
    if content:
        assert content.decode("latin-1")[:20] not in message


def test_a_directory_in_place_of_the_key_file_is_refused(tmp_path):
    path = tmp_path / "wgkey"
    path.mkdir(mode=0o700)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    assert str(err.value) == (
        f"WireGuard key file {path} is a directory, not a regular file: remove it (flanneld "
        "then creates a key there) or set WIREGUARD_KEY_FILE to the key file")


def test_a_device_as_the_key_file_is_refused(tmp_path):
    with pytest.raises(KeyFileError) as err:
        read_key_file(Path("/dev/null"))
    assert str(err.value).startswith("WireGuard key file /dev/null is a character device, "
                                     "not a regular file")


def test_the_key_file_path_follows_wireguard_key_file():
    assert str(key_file_path({})) == "/run/flannel/wgkey"
    assert str(key_file_path({"WIREGUARD_KEY_FILE": "/etc/flannel/key"})) == "/etc/flannel/key"


def test_x25519_matches_rfc_7748():
    alice = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob_pub = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    assert x25519(alice, (9).to_bytes(32, "little")).hex() == (
        "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert x25519(alice, bob_pub).hex() == (
        "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def test_generated_keys_are_clamped_and_distinct():
    a, b = generate_private_key(), generate_private_key()
    assert a != b
    assert a.raw[0] & 7 == 0 and a.raw[31] & 0xC0 == 0x40


def test_a_secret_never_shows_itself():
    key = parse_key("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", "test key")
    for text in (repr(key), str(key), f"{key}", repr([key]), repr({"k": key})):
        assert "AAECAwQF" not in text and "000102" not in text
    assert repr(key) == "Secret(<hidden>)"
    with pytest.raises(TypeError):
        __import__("pickle").dumps(key)
    assert Secret(key.raw) == key


def test_parse_key_names_what_it_parses():
    with pytest.raises(KeyFileError) as err:
        parse_key("hunter2", "the PSK")
    assert str(err.value) == ("the PSK is not a WireGuard key: expected 32 bytes in base64 "
                              "(44 characters, as `wg genkey` prints)")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path):
    path = tmp_path / "wgkey"
    load_or_create_private_key(path)
    os.chown(path, 65534, 65534)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    assert str(err.value) == (f"WireGuard key file {path} is owned by uid 65534, not by root "
                              f"or this process (uid 0); run `chown 0 {path}` if it is really "
                              "the key to use")


def test_an_owner_only_0600_file_and_a_psk_file_are_read(tmp_path):
    path = tmp_path / "psk"
    key = generate_private_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, key.base64().encode() + b"\n")
    os.close(fd)
    assert read_key_file(path) == key
