"""The pure rule engine: telemetry and the current states in, verdicts out."""
