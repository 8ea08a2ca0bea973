"""Kubeconfig files are YAML as kubeadm and kubectl write them (block style, comments, quoted
and plain scalars), read as client-go reads them: YAML 1.1, where ``yes`` and ``on`` are true.
A key given twice in one mapping is refused naming the line, never the values (a token)."""

from __future__ import annotations

import ssl
import textwrap

import pytest

from flannel.clients.kube.auth import StaticToken
from flannel.clients.kube.config import KubeConfigError, from_kubeconfig

KUBECONFIG = """\
# written by kubectl config set-cluster
apiVersion: v1
kind: Config
clusters:
- cluster:
    server: https://10.0.0.1:6443/k8s/clusters/c-abc
    insecure-skip-tls-verify: {insecure}
  name: edge
contexts:
- context: {{cluster: edge, user: "flannel"}}
  name: ctx
current-context: ctx
users:
- name: flannel
  user:
    token: {token}
"""


@pytest.mark.parametrize("insecure", ["yes", "on", "true", "True"])
def test_block_style_kubeconfig_with_yaml_1_1_booleans(tmp_path, insecure):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(insecure=insecure, token="s3cr3t-t0ken"))
    config = from_kubeconfig(str(path))
    assert (config.host, config.port, config.path_prefix) == ("10.0.0.1", 6443,
                                                              "/k8s/clusters/c-abc")
    assert config.context is not None and config.context.verify_mode == ssl.CERT_NONE
    assert config.credentials == StaticToken("s3cr3t-t0ken", config.credentials.source)


def test_a_key_given_twice_is_refused_without_its_values(tmp_path):
    path = tmp_path / "kubeconfig"
    text = KUBECONFIG.format(insecure="false", token="first-t0ken")
    path.write_text(text + textwrap.indent("token: second-t0ken\n", "    "))
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig(str(path))
    assert str(err.value) == (f"{path}: a key appears twice in one mapping at line 17: "
                              "keep one of them")
