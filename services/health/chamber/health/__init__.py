"""The health service: turns telemetry into verdicts about GPUs and nodes and quarantines failing hardware."""
