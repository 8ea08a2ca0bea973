"""Processes, for the operator tools and the engines: finding flanneld and wireguard-go in this
network namespace (``procscan``), stopping a helper process flanneld started (``procstop``),
how ``flannelctl`` and ``flannel-lab`` end when stopped from outside (``stopping``), and
flanneld's open-files limit (``fdlimit``). Nothing here touches the network."""
