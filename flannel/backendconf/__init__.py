"""What every backend and its engine share to read its options, below the import layers so
that the engines (``flannel/wireguard``, ``flannel/ipsec``, ``flannel/extension``,
``flannel/cloud``) use it as the backends do: the errors of the backend contract
(``errors``: ``BackendError``, ``BackendConfigError``) and a ``Backend`` object decoded into
typed options as Go decodes a struct (``options``)."""
