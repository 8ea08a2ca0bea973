"""The clients wing: what flanneld speaks to other servers with, knowing no store, daemon,
kernel or backend.

Two stories, one per caller: the stores' clients are asynchronous, on flanneld's event loop:
``http`` (HTTP/1.1 over asyncio, h11 framing, every read bounded), ``etcd`` (etcd's v3 API
over its JSON gateway), ``kube`` (the Kubernetes API: the calls, kubeconfig and in-cluster
configuration, credentials). The cloud clients block, as the cloud SDKs the other engines
use do, and run in the engines' worker thread: ``fetch`` (one bounded exchange over urllib)
and, through it, ``aliyunrpc`` (Alibaba Cloud's signed RPC API), the Compute Engine API and
the metadata services; none starts an event loop; each is cut short through the caller's
``cut.Cutter``. Each raises its own errors;
the stores translate them into ``StoreUnavailable``/``StoreError``, the cloud engines into
``CloudError``. Each client is imported only where it is used.
"""
