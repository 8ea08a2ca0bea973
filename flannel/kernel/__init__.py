"""Kernel state: reading the host's network and programming what backends need.

Nothing in this package knows about the lease store.
"""
