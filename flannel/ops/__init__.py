"""Operator tooling behind ``flannelctl``: leases, doctor, check, bundle, status, cleanup.

Each module reads the store and the kernel of the network namespace it runs in; only
``leases reserve|release``, ``cleanup`` and the opt-in doctor fixes change anything.
"""
