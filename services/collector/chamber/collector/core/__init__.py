"""Pure parts of the collector: the simulated fleet's model and the telemetry source interface."""
