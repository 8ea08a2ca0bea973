"""The ali-vpc backend: each node's pod subnet routed to its ECS instance in the VPC's route
table, as Go flannel's ali-vpc did (until v0.20).

Config (``Backend``): ``AccessKeyID``/``AccessKeySecret`` (else the ``ACCESS_KEY_ID``/
``ACCESS_KEY_SECRET`` environment variables), and optionally ``Endpoint`` (the VPC API's
URL, default ``https://vpc.<region>.aliyuncs.com``) and ``MetadataURL`` (default
``http://100.100.100.200``). The entry's next hop is this instance, as the metadata service
names it. Needs no SDK: the engine signs its calls itself.
Must not touch: the store, the kernel (the engine in ``flannel.cloud.alivpc`` does the rest).
"""

from __future__ import annotations

from ipaddress import IPv4Network

from flannel.backend.cloudroutes import CloudRouteBackend, RouteEngine
from flannel.cloud.alivpc import AliVpcConfig, AliVpcRoutes
from flannel.cloud.metadata import ALIYUN_TOKENS, MetadataClient
from flannel.cloud.options import KEY_OPTIONS


class AliVpcBackend(CloudRouteBackend):
    type_name = "ali-vpc"
    # No SDK to import: the engine's API client (flannel.clients.aliyunrpc) is the standard
    # library and the project's HTTP layer only.
    sdk_module = ""
    extra = ""
    option_names = tuple(KEY_OPTIONS.values())

    def make_engine(self, network: IPv4Network) -> RouteEngine:
        config = AliVpcConfig.from_backend(self.config.backend, network)
        return AliVpcRoutes(config, MetadataClient(config.metadata_url, token=True,
                                                   scheme=ALIYUN_TOKENS))
