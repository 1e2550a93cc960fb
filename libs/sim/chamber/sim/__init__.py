"""The simulator: real cluster traces replayed through the real scheduling, quota and health cores on a virtual
clock (no NATS, no Redis), next to the baselines people run today."""
