"""DeepSpeed log parsing: timers, throughput, memory, comms logger and engine configuration."""
