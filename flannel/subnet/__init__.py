"""Subnet managers: where leases live (etcd v3 or the Kubernetes API) and how they are watched.

Owns the choice of store and its lazy import: the etcd store and its client
(``flannel.clients.etcd``) are loaded only in etcd mode, the Kubernetes store and its API
client (``flannel.clients.kube``) only in kube mode, so a node pays in memory and start-up
time for the one store it uses.
Nothing in this package touches the kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flannel.settings import KubeSettings, StoreSettings
from flannel.subnet.errors import StoreError

if TYPE_CHECKING:
    from flannel.subnet.manager import SubnetManager


class StoreOpenError(StoreError):
    """The store options are unusable; the message names the option and what to fix."""


def open_store(store: StoreSettings) -> SubnetManager:
    """The subnet manager the store settings ask for, importing only that store's client."""
    if isinstance(store, KubeSettings):
        from flannel.subnet.kube.manager import KubeError, make_kube_manager

        try:
            return make_kube_manager(store)
        except KubeError as err:
            raise StoreOpenError(str(err)) from None
    from flannel.clients.etcd import EtcdOptionError
    from flannel.subnet.etcd.manager import make_etcd_manager

    try:
        return make_etcd_manager(store)
    except EtcdOptionError as err:
        raise StoreOpenError(str(err)) from None
