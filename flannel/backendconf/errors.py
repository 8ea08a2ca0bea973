"""The errors of the backend contract, kept below the import layers so that the engines'
option decoders (``flannel/wireguard``, ``flannel/extension``, ``flannel/cloud``) raise
them as the backends do.

``BackendError``: a backend cannot be created or started. ``BackendConfigError``: its options
(the network config's ``Backend`` object) cannot be used; every backend's config dataclass
raises it from ``from_backend``. Both messages say what to fix.
Must not touch: anything; declarations only.
"""

from __future__ import annotations


class BackendError(Exception):
    """A backend cannot be created or started; the message says what to fix."""


class BackendConfigError(BackendError):
    """A backend's options cannot be used; the message names the field and the fix."""
