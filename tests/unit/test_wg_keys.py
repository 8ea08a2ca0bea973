"""The WireGuard key file rules and key handling."""

import base64
import os
import shutil
import stat
import subprocess

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


def test_a_key_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "wgkey"
    load_or_create_private_key(path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(path)
    assert str(err.value) == (f"WireGuard key file {path} has mode 0644, readable by others; "
                              f"run `chmod 0400 {path}` (and consider the key leaked)")


def test_a_key_file_that_is_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    load_or_create_private_key(real)
    link = tmp_path / "wgkey"
    link.symlink_to(real)
    with pytest.raises(KeyFileError) as err:
        load_or_create_private_key(link)
    assert str(err.value) == (f"WireGuard key file {link} is a symbolic link; replace it with "
                              "the key file itself")


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
    assert str(err.value) == f"WireGuard key file {path} is not a regular file"


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
    assert str(err.value) == (f"WireGuard key file {path} is owned by uid 65534, not by this "
                              f"process (uid 0); run `chown 0 {path}` if it is really the key "
                              "to use")


def test_an_owner_only_0600_file_and_a_psk_file_are_read(tmp_path):
    path = tmp_path / "psk"
    key = generate_private_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, key.base64().encode() + b"\n")
    os.close(fd)
    assert read_key_file(path) == key
