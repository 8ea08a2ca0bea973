"""Probes of the peers over the overlay, shared by flanneld and the operator tools: the raw
ICMP/UDP pinger that matches every answer to its probe (``icmp``), the sequence of one probe
and the cause it tells (``sequence``), the pace of flanneld's continuous probes
(``schedule``) and the daemon's task that runs them (``prober``). Beside the data plane,
above the backends (it probes what a backend's plan of each peer declares) and the kernel;
it never imports the operator tools, the monitoring wing, the data plane or the store, so
both flanneld and ``flannelctl`` can take it."""
