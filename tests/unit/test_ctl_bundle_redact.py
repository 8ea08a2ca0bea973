"""What ``flannelctl bundle`` removes from every file before it is stored."""

from __future__ import annotations

from flannel.ops.bundle import redact


def test_flag_values_and_environment_secrets():
    line = "flanneld --etcd-password=hunter2 --etcd-username=flannel FLANNELD_ETCD_PASSWORD=x1"
    assert redact(line) == ("flanneld --etcd-password=<redacted> --etcd-username=flannel "
                            "FLANNELD_ETCD_PASSWORD=<redacted>")


def test_tokens_keys_and_url_credentials():
    text = ('Authorization: Bearer abc.def.ghi\n"token": "s3cr3t"\n'
            "https://user:pw@etcd:2379\n-----BEGIN RSA PRIVATE KEY-----\nMIIB\n"
            "-----END RSA PRIVATE KEY-----\nkept")
    assert redact(text) == ('Authorization: <redacted>\n"token": "<redacted>"\n'
                            "https://<redacted>@etcd:2379\n<redacted private key>\nkept")


def test_bearer_token_anywhere():
    assert redact("sent header Bearer eyJhbGc.x-y") == "sent header Bearer <redacted>"


def test_ordinary_text_is_kept():
    text = '{"PublicIP":"192.168.1.1","BackendType":"vxlan"}\nFLANNEL_MTU=1450\n'
    assert redact(text) == text
