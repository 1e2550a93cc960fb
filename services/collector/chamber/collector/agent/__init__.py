"""The node agent's job runner: starts each replica placed on its node as a process group under a small
supervisor (the shim), stops it with SIGTERM, the checkpoint grace and SIGKILL, reports how it ended, serves its
output, and re-adopts its replicas after a restart. See docs/agent.md.

Kept free of imports: `python -m chamber.collector.agent.shim` starts one interpreter per replica.
"""
