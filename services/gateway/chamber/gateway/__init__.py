"""The gateway: Chamber's HTTP API (and, later, gRPC and the dashboard). It validates, publishes, and reads."""
