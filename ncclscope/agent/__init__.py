"""The sidecar that runs beside a training job: NVML and psutil samplers (``nvml``,
``host``), the live log follower (``follow``), the metric catalog and exporter
(``catalog``, ``exporter``), the live window through the detectors (``live``), the
loop (``run``), telemetry part files (``telemetry``) and replay (``replay``)."""
