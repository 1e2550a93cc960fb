"""Chamber's Kubernetes adapter: one client over the official `kubernetes` library, its own error hierarchy, the
reflector (list -> watch -> relist on 410), and pure readers of Jobs and nodes.

`client` and `watch` import the `kubernetes` library; `labels`, `workloads` and `nodes` are pure (no client, no
I/O) so pure code and the webhooks can share them. Services import this package, never `kubernetes` itself
(import-linter checks it).
"""
