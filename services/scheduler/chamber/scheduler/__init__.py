"""The scheduler service: consumes job events, places work on free healthy GPUs, drives the executor."""
