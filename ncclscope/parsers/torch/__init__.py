"""PyTorch distributed (c10d ProcessGroupNCCL) and torchelastic log parsing."""
