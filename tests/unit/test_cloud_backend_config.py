"""The aws-vpc, tencent-vpc, ali-vpc and gce backends before any cloud call: registration,
what they publish, and the messages a user sees for an unusable config or a missing SDK
extra."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from flannel.backend import BackendError, backend_class
from flannel.config import NetworkConfig
from flannel.kernel.iface import ExternalInterface

EXT = ExternalInterface("eth0", 2, 9001, IPv4Address("10.0.1.5"), None,
                        IPv4Address("10.0.1.5"), None)
NETWORK = IPv4Network("10.244.0.0/16")
TENCENT_KEYS = {"AccessKeyID": "AKIDunitTestKey0001", "AccessKeySecret": "unit-test-secret-42"}


def prepare(backend_type: str, backend: dict, **fields: Any):
    config = NetworkConfig(network=NETWORK, backend_type=backend_type,
                           backend={"Type": backend_type, **backend}, **fields)
    return asyncio.run(backend_class(backend_type)(EXT, config).prepare())


@pytest.mark.parametrize(("backend_type", "backend"), [("aws-vpc", {}),
                                                       ("tencent-vpc", TENCENT_KEYS),
                                                       ("ali-vpc", TENCENT_KEYS),
                                                       ("gce", {})])
def test_publishes_no_backend_type_and_the_interface_mtu_as_go_does(backend_type, backend):
    local = prepare(backend_type, backend)
    assert (local.backend_type, local.mtu, local.backend_data) == ("", 9001, None)


@pytest.mark.parametrize(("backend_type", "backend", "message"), [
    ("aws-vpc", {"RouteTableID": {"id": "rtb-1"}}, "aws-vpc backend: Backend.RouteTableID "
     "must be a string or a list of strings, not a object"),
    ("aws-vpc", {"RouteTableID": ["rtb-00000000", "main"]}, "aws-vpc backend: "
     "Backend.RouteTableID: 'main' is not a route table ID (rtb- followed by hex digits)"),
    ("tencent-vpc", {}, "tencent-vpc backend: ACCESS_KEY_ID and ACCESS_KEY_SECRET must be "
     "provided! "),
    ("tencent-vpc", {**TENCENT_KEYS, "Endpoint": "ftp://vpc"}, "tencent-vpc backend: "
     "Backend.Endpoint: 'ftp://vpc' is not a URL"),
    ("ali-vpc", {"AccessKeyID": "LTAIunitTestKey0001"}, "ali-vpc backend: ACCESS_KEY_ID and "
     "ACCESS_KEY_SECRET must be provided! "),
    ("ali-vpc", {**TENCENT_KEYS, "MetadataURL": "100.100.100.200"}, "ali-vpc backend: "
     "Backend.MetadataURL: '100.100.100.200' is not a URL of the form http://host[:port]"),
    ("gce", {"Project": "No Such Project"}, "gce backend: Backend.Project: 'No Such Project' "
     "is not a project ID"),
    ("gce", {"Network": ["default"]}, "gce backend: Backend.Network must be a string, not a "
     "array"),
])
def test_unusable_config_is_refused_with_what_to_fix(backend_type, backend, message,
                                                     monkeypatch):
    monkeypatch.delenv("ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("ACCESS_KEY_SECRET", raising=False)
    with pytest.raises(BackendError) as raised:
        prepare(backend_type, backend)
    assert str(raised.value).startswith(message)
    assert "unit-test-secret-42" not in str(raised.value)


@pytest.mark.parametrize("backend_type", ["aws-vpc", "tencent-vpc", "ali-vpc", "gce"])
def test_ipv6_is_refused(backend_type):
    with pytest.raises(BackendError) as raised:
        prepare(backend_type, TENCENT_KEYS, enable_ipv6=True)
    assert str(raised.value) == (f"the {backend_type} backend routes IPv4 pod subnets only: "
                                 "set Network, and leave EnableIPv6 unset (or false)")


@pytest.mark.parametrize(("backend_type", "module", "extra"), [
    ("aws-vpc", "boto3", "aws"),
    ("tencent-vpc", "tencentcloud.vpc.v20170312.vpc_client", "tencent")])
def test_missing_sdk_names_the_extra(backend_type, module, extra, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # what an absent package looks like
    with pytest.raises(BackendError) as raised:
        prepare(backend_type, TENCENT_KEYS)
    assert str(raised.value) == (f"the {backend_type} backend needs the Python module "
                                 f"{module!r}, which is not installed: install it with "
                                 f"pip install 'pyflannel[{extra}]'")


def test_the_metadata_address_follows_boto3s_variable(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "https://169.254.169.254")
    with pytest.raises(BackendError) as raised:
        prepare("aws-vpc", {})
    assert str(raised.value) == ("aws-vpc backend: the metadata service address must be an "
                                 "http:// URL, not 'https://169.254.169.254'")


#: Imports the ali-vpc backend and prepares it (its engine made) with Alibaba's SDKs and
#: ``cryptography`` unimportable; prints the MTU it publishes.
ALI_VPC_WITHOUT_SDK = """
import asyncio, sys
from ipaddress import IPv4Address, IPv4Network
from typing import Any

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top.startswith(("aliyunsdk", "alibabacloud")) or top == "cryptography":
            raise ImportError(f"{name} is not installed")
        return None

sys.meta_path.insert(0, NotInstalled())
from flannel.backend.alivpc import AliVpcBackend
from flannel.config import NetworkConfig
from flannel.kernel.iface import ExternalInterface

ext = ExternalInterface("eth0", 2, 9001, IPv4Address("10.0.1.5"), None,
                        IPv4Address("10.0.1.5"), None)
config = NetworkConfig(network=IPv4Network("10.244.0.0/16"), backend_type="ali-vpc",
                       backend={"Type": "ali-vpc", "AccessKeyID": "LTAIunitTestKey0001",
                                "AccessKeySecret": "unit-test-secret-42"})
print(asyncio.run(AliVpcBackend(ext, config).prepare()).mtu)
"""


def test_ali_vpc_needs_no_sdk_extra():
    # Its engine signs its own calls: no module outside the locked runtime is imported. A
    # fresh interpreter, so that no module another test imported hides an import.
    child = subprocess.run([sys.executable, "-c", ALI_VPC_WITHOUT_SDK], capture_output=True,
                           text=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "9001"


def test_gce_options_are_checked_when_the_config_is_read():
    config = NetworkConfig(network=NETWORK, backend_type="gce",
                           backend={"Type": "gce", "Endpoint": "compute.googleapis.com"})
    with pytest.raises(BackendError) as raised:
        backend_class("gce").check_options(config)
    assert str(raised.value).startswith("gce backend: Backend.Endpoint: "
                                        "'compute.googleapis.com' is not a URL")


def test_gce_needs_no_sdk_without_a_key_file(monkeypatch):
    """The instance's service account is plain REST: google-auth may be absent."""
    monkeypatch.setitem(sys.modules, "google.auth", None)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    assert prepare("gce", {}).mtu == 9001
