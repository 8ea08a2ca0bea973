"""Traffic rules: masquerade and forward acceptance, with iptables or nftables.

Nothing here knows about the lease store; the daemon hands in the networks and subnets.
"""
