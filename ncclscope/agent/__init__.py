"""The sidecar's samplers: NVML (GPU) and psutil (host), each cheap enough to run every second."""
