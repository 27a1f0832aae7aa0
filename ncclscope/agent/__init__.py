"""The sidecar that runs beside a training job: follows its logs live (``follow``)."""
