"""An Alibaba Cloud VPC double for each test (the ``cloud`` fixture: the API, the metadata service,
the engines' credentials) and ali-vpc route engines against it."""

from __future__ import annotations

import pytest

from flannel.cloud.alivpc import AliVpcConfig, AliVpcRoutes
from flannel.cloud.base import ThrottleRetry
from flannel.cloud.metadata import ALIYUN_TOKENS, MetadataClient
from tests.support.aliyunapi import FakeAliyunMetadata, FakeAliyunVpc
from tests.support.cloudengines import (
    FAST,
    NETWORK,
)

KEY_ID = "LTAIflannelTestKey0001"


SECRET = "flannel-aliyun-secret-never-logged-9876"


VPC = "vpc-bp1flannel0000000001"


REGION = "cn-hangzhou"


INSTANCES = ["i-bp1flannelnode00001", "i-bp1flannelnode00002", "i-bp1flannelnode00003"]


@pytest.fixture
def cloud(no_proxy):
    api = FakeAliyunVpc({KEY_ID: SECRET}, region=REGION).start()
    api.table = api.add_vpc(VPC, tables=2)[0]
    api.add_vpc("vpc-bp1someoneelse00000")
    api.instances.update(INSTANCES)
    served = [FakeAliyunMetadata({"127.0.0.1": {"region-id": REGION, "instance-id": instance,
                                                "vpc-id": VPC}}, enforced=True).start()
              for instance in INSTANCES]
    yield api, served
    for server in (*served, api):
        server.stop()


def engine(cloud, index: int, backend: dict | None = None, backoff: ThrottleRetry = FAST,
           timeout: float = 10.0) -> AliVpcRoutes:
    api, served = cloud
    members = backend if backend is not None else {"AccessKeyID": KEY_ID,
                                                   "AccessKeySecret": SECRET}
    config = AliVpcConfig.from_backend({**members, "Endpoint": f"http://{api.endpoint}"},
                                       NETWORK, environ={})
    return AliVpcRoutes(config, MetadataClient(served[index].url, token=True,
                                               scheme=ALIYUN_TOKENS),
                        backoff=backoff, timeout=timeout)
