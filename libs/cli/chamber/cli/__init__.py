"""The `chamber` command: run one service, run them all, and (later) benchmarks and simulations."""
