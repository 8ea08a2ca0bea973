"""The clients wing: what flanneld speaks to other servers with, knowing no store, daemon,
kernel or backend.

``http`` (HTTP/1.1 over asyncio, h11 framing, every read bounded), ``etcd`` (etcd's v3 API
over its JSON gateway), ``kube`` (the Kubernetes API: the calls, kubeconfig and in-cluster
configuration, credentials), ``aliyunrpc`` (Alibaba Cloud's signed RPC API) and ``fetch``
(one bounded exchange over urllib, for the Compute Engine API and metadata services); the
blocking ones are cut short through the caller's ``cut.Cutter``. Each raises its own errors;
the stores translate them into ``StoreUnavailable``/``StoreError``, the cloud engines into
``CloudError``. Each client is imported only where it is used.
"""
