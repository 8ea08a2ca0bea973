"""Which flanneld a ``flannelctl`` command is about: where its store and subnet.env are.

Owns the one resolution that ``doctor``, ``check``, ``leases`` and ``bundle`` use (``status``
asks the socket of the same flanneld, found by the same ``flannel.ops.discover.find``): each
store flag from the command line, else from its ``FLANNELD_*`` variable in the tool's
environment, else as the flanneld running in this network namespace uses it (its command
line and environment, its files reached through its root: a lab node's private ``/run``, a
pod's), else flanneld's default; how to say which was used; and what to give when the
running flanneld cannot be told (several run here, or this user may not read its settings).
Must not touch: the kernel, the store.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace

from flannel.ops.discover import Flanneld, NotFound, find
from flannel.ops.storeflags import StoreOptions, explicit, of_running, resolve, shown
from flannel.settings import KubeSettings


@dataclass(frozen=True)
class Located:
    """The store and subnet.env a command uses, and whose settings said so."""

    store: StoreOptions
    #: The flanneld running here, whose settings fill what no flag gives.
    found: Flanneld | None
    #: Why that flanneld's settings are unknown or partial ("" when read whole, or none runs).
    note: str
    #: The store flags given on the command line or in ``FLANNELD_*``.
    given: tuple[str, ...]

    @property
    def guessed(self) -> bool:
        """Nothing was given and the running flanneld's settings could not be read: the
        store is flanneld's default, which may not be this node's."""
        return bool(self.note) and not self.given

    def source(self) -> str:
        """Which store, from whose settings, and the subnet.env: one line."""
        store, found, given = self.store.store, self.found, self.given
        if isinstance(store, KubeSettings):
            api = store.api_url or store.kubeconfig_file or "in-cluster"
            place = f"the Kubernetes API ({api}), network config {store.net_config_path}"
        else:
            place = f"etcd {shown('etcd-endpoints', store.endpoints)}, prefix {store.prefix}"
        if found is not None and found.flags is not None:
            whose = "the settings of the flanneld running here"
            if given:
                whose += f", overridden by {', '.join('--' + name for name in given)}"
        elif given:
            whose = "the flags given"
        else:
            whose = "flanneld's defaults"
        env = (found.subnet_file if found is not None and found.flags is not None
               and "subnet-file" not in given else self.store.subnet_file)
        return f"{place}, from {whose}; subnet.env {env}"

    def refusal(self) -> str:
        """What to do when the store is only a guess."""
        return (f"cannot tell which store this node's flanneld uses: {self.note}; or give "
                "flanneld's store flags (--etcd-endpoints, --etcd-prefix, --subnet-file... "
                "or --kube-subnet-mgr...)")


def locate(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Located:
    """The store options of a command's ``args`` (command line > ``FLANNELD_*`` > the
    flanneld running here > flanneld's default); UsageError names a bad value."""
    environ = dict(os.environ if environ is None else environ)
    given = tuple(explicit(args, environ))
    wanted = getattr(args, "subnet_file", None) or environ.get("FLANNELD_SUBNET_FILE", "")
    try:
        found, note = find(wanted), ""
    except NotFound as err:
        found, note = None, str(err)
    if found is not None:
        note = found.why
    store = resolve(args, environ, of_running(found) if found is not None else None)
    if found is not None and found.flags is not None and store.subnet_file == found.subnet_file:
        # Given as flanneld names it (a file in its private /run...): read where it is.
        store = replace(store, subnet_file=str(found.path(found.subnet_file)))
    return Located(store, found, note, given)
