"""The store flags of ``flannelctl`` commands: flanneld's names, ``FLANNELD_*`` fallbacks.

Owns declaring flanneld's store flags on a ``flannelctl`` command, and turning the command
line (and environment), and what the node's running flanneld uses (``flannel.ops.discover``),
into ``StoreOptions``: the typed store settings (``flags.store_settings``) and the subnet.env,
built once so that an operator can paste flanneld's own flags or give none.
Must not touch: the kernel, the store.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flannel.flags import FLAGS, Flag, UsageError, shown_value, store_settings
from flannel.settings import EtcdSettings, StoreSettings

if TYPE_CHECKING:
    from flannel.ops.discover import Flanneld

#: flanneld flags that say where the store is and how to reach it.
STORE_FLAGS = ("etcd-endpoints", "etcd-prefix", "etcd-keyfile", "etcd-certfile", "etcd-cafile",
               "etcd-username", "etcd-password", "kube-subnet-mgr", "kube-api-url",
               "kube-annotation-prefix", "kubeconfig-file", "net-config-path", "subnet-file")
_BY_NAME = {flag.name: flag for flag in FLAGS}


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    for name in STORE_FLAGS:
        flag = _BY_NAME[name]
        shown = flag.default if flag.kind != "bool" else "false"
        help_text = f"{flag.help} (env {flag.env_name}, default {shown or 'empty'})"
        if flag.kind == "bool":
            parser.add_argument(f"--{name}", dest=flag.dest, nargs="?", const="true",
                                default=None, help=help_text)
        else:
            parser.add_argument(f"--{name}", dest=flag.dest, default=None, help=help_text)


#: Store flags naming files, read where the flanneld that was given them reads them.
PATH_FLAGS = ("etcd-keyfile", "etcd-certfile", "etcd-cafile", "kubeconfig-file",
              "net-config-path", "subnet-file")


def _value(flag: Flag, given: str | None, environ: dict[str, str],
           running: dict[str, object]) -> object:
    if given is not None:
        text, source = given, f"--{flag.name}"
    elif environ.get(flag.env_name):
        text, source = environ[flag.env_name], flag.env_name
    elif flag.dest in running:
        return running[flag.dest]
    else:
        return flag.default
    try:
        return flag.convert(text)
    except ValueError as err:
        raise UsageError(f"{source}={text!r}: {err}") from None


def shown(name: str, value: object) -> str:
    """A store flag's value as flanneld logs it, credentials masked."""
    return shown_value(_BY_NAME[name], value)


def quiet_store_logs() -> None:
    """The store managers log for a daemon; these commands report what matters themselves."""
    logging.getLogger("flannel").setLevel(logging.ERROR)


def of_running(flanneld: Flanneld) -> dict[str, object]:
    """The store flags of a running flanneld by dest, its files as reached from here."""
    if flanneld.flags is None:
        return {}
    values: dict[str, object] = {}
    for name in STORE_FLAGS:
        dest = _BY_NAME[name].dest
        value = flanneld.flags[dest]
        if name in PATH_FLAGS and value:
            value = str(flanneld.path(str(value)))
        values[dest] = value
    return values


@dataclass(frozen=True)
class StoreOptions:
    """Where the store is and how to reach it, and the subnet.env, as a command uses them."""

    store: StoreSettings
    subnet_file: str

    @property
    def kube(self) -> bool:
        return not isinstance(self.store, EtcdSettings)


def explicit(args: argparse.Namespace, environ: dict[str, str] | None = None) -> list[str]:
    """The store flags given on the command line or in ``FLANNELD_*``."""
    environ = dict(os.environ if environ is None else environ)
    return [name for name in STORE_FLAGS
            if getattr(args, _BY_NAME[name].dest) is not None
            or environ.get(_BY_NAME[name].env_name)]


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None,
            running: dict[str, object] | None = None) -> StoreOptions:
    """The store options of ``args`` (command line > environment > ``running``, the values
    of the node's running flanneld by flag dest > flanneld's default); UsageError names a
    bad value."""
    environ = dict(os.environ if environ is None else environ)
    values = argparse.Namespace()
    for name in STORE_FLAGS:
        flag = _BY_NAME[name]
        setattr(values, flag.dest, _value(flag, getattr(args, flag.dest), environ,
                                          running or {}))
    # Read by the managers, meaningless to a command that acquires no lease.
    for name in ("subnet-lease-ttl", "subnet-lease-renew-margin"):
        flag = _BY_NAME[name]
        setattr(values, flag.dest, flag.default)
    values.set_node_network_unavailable = False
    return StoreOptions(store_settings(values), str(values.subnet_file))
