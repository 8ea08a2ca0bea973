"""Operator tooling behind ``flannelctl``: leases, doctor, check, bundle.

Each module reads the store and the kernel of the network namespace it runs in; only
``leases reserve|release`` and the opt-in doctor fixes change anything.
"""
