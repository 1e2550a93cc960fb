"""Chaos: the real services under faults, and an independent checker of what they recorded (docs/reliability.md)."""
