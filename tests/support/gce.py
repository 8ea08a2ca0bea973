"""A Compute Engine double for each test (the ``compute`` fixture), gce route engines against it
and the service-account key files they sign with."""

from __future__ import annotations

import json
import os

import pytest

from flannel.cloud.gce import GceConfig, GceRoutes
from flannel.cloud.gceauth import GceMetadata
from tests.support.cloudengines import (
    FAST,
    NETWORK,
)
from tests.support.gceapi import FakeCompute, FakeGceMetadata, metadata_paths

ZONE = "europe-west1-b"


VPC = "flannel-net"


NODES = ["node-1", "node-2", "node-3"]


@pytest.fixture
def compute(no_proxy):
    api = FakeCompute("flannel-test").start()
    api.network_link = api.add_network(VPC)
    api.add_network("other-net")
    served: list[FakeGceMetadata] = []
    api.metadata = lambda instance: served[NODES.index(instance)]
    for name in NODES:
        api.add_instance(ZONE, name)
        served.append(FakeGceMetadata(api, metadata_paths(api, ZONE, name, VPC)).start())
    yield api
    for server in (*served, api):
        server.stop()


def engine(api, instance: str = NODES[0], backend: dict | None = None,
           environ: dict | None = None, **options) -> GceRoutes:
    config = GceConfig.from_backend({"Endpoint": api.url, **(backend or {})}, NETWORK,
                                    environ=environ or {})
    metadata = GceMetadata(f"http://{api.metadata(instance).host}", timeout=2)
    return GceRoutes(config, metadata, backoff=FAST, poll_interval=0.01, **options)


def service_account_key(tmp_path, compute) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    email = "flannel@flannel-test.iam.gserviceaccount.com"
    compute.keys["key-1"] = (email, public.decode())
    path = tmp_path / "key.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"type": "service_account", "project_id": "flannel-test",
                   "private_key_id": "key-1", "private_key": private, "client_email": email,
                   "token_uri": f"{compute.url}/token"}, file)
    return str(path), private
