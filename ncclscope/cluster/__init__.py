"""What the cluster's own exporters measured, read from its Prometheus beside the logs
(issue #29): node_exporter's InfiniBand ports, dcgm-exporter's GPU health and the agent's
own series, for the job's hosts and time window.  ``tables`` holds what is read
(``ClusterTables``); the reading itself is bounded and never fatal: what was asked and
what came back is kept (``Ask``) and said in the report."""
