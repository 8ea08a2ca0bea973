"""Cloud route engines: a node's subnet routed by the cloud's VPC route table, not the kernel.

Each engine (``awsvpc.AwsVpcRoutes``, ``tencentvpc.TencentVpcRoutes``,
``alivpc.AliVpcRoutes``, ``gce.GceRoutes``) takes the desired state (our lease and the live
peer leases) and reconciles the cloud's route table towards it, reporting what it changed and
its status. Every method blocks on HTTP calls and is meant to run in a worker thread
(``asyncio.to_thread``). The cloud SDKs are optional extras, imported only when an engine is
built (ali-vpc needs none: ``aliyunrpc`` signs its calls; nor does gce: plain REST). Must not
touch: the store, the kernel, local files other than a credentials file the user names (as
the SDKs read theirs: gce's ``GOOGLE_APPLICATION_CREDENTIALS``).
"""
