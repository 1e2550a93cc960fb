"""The collector: GPU and node inventory and telemetry, from NVML on real nodes or from a simulated fleet."""
