"""The gce backend's options and Go's route names, decoded without any cloud call."""

from __future__ import annotations

from ipaddress import IPv4Network

import pytest

from flannel.backendconf.errors import BackendConfigError
from flannel.cloud.base import CloudError
from flannel.cloud.gce import GceConfig, route_name
from flannel.cloud.gceauth import metadata_base

NETWORK = IPv4Network("10.244.0.0/16")


def test_route_names_are_gos():
    assert route_name(IPv4Network("10.244.3.0/24")) == "flannel-10-244-3-0-24"


@pytest.mark.parametrize(("members", "message"), [
    ({"Project": "Bad Project"}, "Backend.Project: 'Bad Project' is not a project ID"),
    ({"Network": "-net"}, "Backend.Network: '-net' is not a network name"),
    ({"Network": 5}, "Backend.Network must be a string, not a number"),
    ({"Endpoint": "compute.googleapis.com"}, "Backend.Endpoint: 'compute.googleapis.com' is "
                                             "not a URL of the form https://host[:port]"),
    ({"Endpoint": "https://compute.googleapis.com/compute/v1"}, "Backend.Endpoint: "),
])
def test_bad_options_are_refused(members, message):
    with pytest.raises(BackendConfigError) as raised:
        GceConfig.from_backend(members, NETWORK, environ={})
    assert str(raised.value).startswith(message)


def test_options_in_any_case_and_defaults():
    config = GceConfig.from_backend({"project": "host-project", "NETWORK": "shared-vpc"},
                                    NETWORK, environ={})
    assert (config.project, config.vpc_network, config.endpoint, config.key_file) == (
        "host-project", "shared-vpc", "https://compute.googleapis.com", "")


def test_the_key_file_comes_from_the_environment():
    config = GceConfig.from_backend({}, NETWORK,
                                    environ={"GOOGLE_APPLICATION_CREDENTIALS": "/etc/key.json"})
    assert config.key_file == "/etc/key.json"


def test_the_metadata_server_moves_with_gce_metadata_host():
    assert metadata_base({}) == "http://169.254.169.254"
    assert metadata_base({"GCE_METADATA_HOST": "10.0.0.5:8080"}) == "http://10.0.0.5:8080"
    with pytest.raises(CloudError, match=r"GCE_METADATA_HOST='http://x/' is not host\[:port\]"):
        metadata_base({"GCE_METADATA_HOST": "http://x/"})
