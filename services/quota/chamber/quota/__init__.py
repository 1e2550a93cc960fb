"""The quota service: owns team quotas and accounting, and publishes the quota state the scheduler reads."""
