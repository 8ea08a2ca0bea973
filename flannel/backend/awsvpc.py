"""The aws-vpc backend: each node's pod subnet routed to its ENI in the VPC's route table(s).

Config (``Backend``): ``RouteTableID``, a route table ID or a list of them, as Go flannel
read it; absent, the table associated with the node's subnet, else the VPC's main table.
The ENI is the one holding the external interface's own address. Endpoints are boto3's own
settings: the EC2 endpoint follows ``AWS_ENDPOINT_URL_EC2``/``AWS_ENDPOINT_URL`` (or the
AWS config file), the instance metadata service ``AWS_EC2_METADATA_SERVICE_ENDPOINT``
(default ``http://169.254.169.254``); credentials are boto3's default chain.
Must not touch: the store, the kernel (the engine in ``flannel.cloud.awsvpc`` does the rest).
"""

from __future__ import annotations

import os
from ipaddress import IPv4Address, IPv4Network

from flannel.backend.base import BackendError
from flannel.backend.cloudroutes import CloudRouteBackend, RouteEngine
from flannel.cloud.awsvpc import AwsVpcConfig, AwsVpcRoutes
from flannel.cloud.base import CloudError
from flannel.cloud.metadata import AWS_IMDS, MetadataClient
from flannel.config import NetworkConfig

#: The variable boto3 itself reads for the metadata service's address.
METADATA_ENDPOINT_VARIABLE = "AWS_EC2_METADATA_SERVICE_ENDPOINT"


class AwsVpcBackend(CloudRouteBackend):
    type_name = "aws-vpc"
    sdk_module = "boto3"
    extra = "aws"
    option_names = ("RouteTableID",)

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        try:
            AwsVpcConfig.from_backend(config.backend, IPv4Network("0.0.0.0/0"),
                                      IPv4Address(0))
        except CloudError as err:
            raise BackendError(str(err)) from None

    def make_engine(self, network: IPv4Network) -> RouteEngine:
        address = self._address(self.ext.iface_addr, "address")
        config = AwsVpcConfig.from_backend(self.config.backend, network, address)
        metadata = MetadataClient(os.environ.get(METADATA_ENDPOINT_VARIABLE) or AWS_IMDS,
                                  token=True)
        return AwsVpcRoutes(config, metadata)
