"""The tencent-vpc backend: each node's pod subnet routed to its address in the VPC's first
route table, as Go flannel's tencent-vpc does.

Config (``Backend``): ``AccessKeyID``/``AccessKeySecret`` (else the ``ACCESS_KEY_ID``/
``ACCESS_KEY_SECRET`` environment variables), and optionally ``Endpoint`` (the VPC API's
URL, e.g. the in-VPC ``https://vpc.internal.tencentcloudapi.com``) and ``MetadataURL``
(default ``http://metadata.tencentyun.com``). The route's gateway is our public address.
Must not touch: the store, the kernel (the engine in ``flannel.cloud.tencentvpc`` does the
rest).
"""

from __future__ import annotations

from ipaddress import IPv4Network

from flannel.backend.cloudroutes import CloudRouteBackend, RouteEngine
from flannel.cloud.metadata import MetadataClient
from flannel.cloud.options import KEY_OPTIONS
from flannel.cloud.tencentvpc import TencentVpcConfig, TencentVpcRoutes


class TencentVpcBackend(CloudRouteBackend):
    type_name = "tencent-vpc"
    sdk_module = "tencentcloud.vpc.v20170312.vpc_client"
    extra = "tencent"
    # Decoded once the node's address is known (the keys may come from the environment).
    option_names = tuple(KEY_OPTIONS.values())

    def make_engine(self, network: IPv4Network) -> RouteEngine:
        address = self._address(self.ext.ext_addr, "public address")
        config = TencentVpcConfig.from_backend(self.config.backend, network, address)
        return TencentVpcRoutes(config, MetadataClient(config.metadata_url, token=False))
