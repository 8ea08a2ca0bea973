"""What the components report and the monitoring wing reads, kept here so that no component
imports the wing: readiness (``readiness``: the one object /readyz, systemd and the log
read), the records and peers skipped (``skips``: logged once, counted, shown on /status and
/metrics), the reconcile pass durations (``histogram``: buckets without prometheus_client).
Below every layer; nothing here acts."""
