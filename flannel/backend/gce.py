"""The gce backend: each node's pod subnet routed to its instance in the VPC network, as Go
flannel's gce backend did (removed in v0.20).

Config (``Backend``): optionally ``Project`` and ``Network`` (where the routes go: default the
instance's project and its first interface's network) and ``Endpoint`` (the Compute API's
URL). Credentials: the service-account key file ``GOOGLE_APPLICATION_CREDENTIALS`` names
(needs the ``gce`` extra), else the instance's service account through the metadata server
(``GCE_METADATA_HOST`` overrides where that is). The lease carries the public IP only, as Go's.
Must not touch: the store, the kernel (the engine in ``flannel.cloud.gce`` does the rest).
"""

from __future__ import annotations

import os
from ipaddress import IPv4Network

from flannel.backend.base import BackendConfigError
from flannel.backend.cloudroutes import CloudRouteBackend, RouteEngine
from flannel.cloud.gce import GceConfig, GceRoutes
from flannel.cloud.gceauth import GceMetadata, metadata_base
from flannel.config import NetworkConfig


class GceBackend(CloudRouteBackend):
    type_name = "gce"
    # Plain REST on the standard library: no SDK to import (google-auth only signs for a
    # key file, imported then).
    sdk_module = ""
    extra = "gce"
    option_names = ("Project", "Network", "Endpoint")

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        try:
            GceConfig.from_backend(config.backend, IPv4Network("0.0.0.0/0"), environ={})
        except BackendConfigError as err:
            raise BackendConfigError(f"gce backend: {err}") from None

    def make_engine(self, network: IPv4Network) -> RouteEngine:
        config = GceConfig.from_backend(self.config.backend, network)
        return GceRoutes(config, GceMetadata(metadata_base(os.environ)))
