"""Shared ground for every Chamber service: event contracts, subjects, and the bus and ledger adapters.

Services depend on this package and on nothing of each other; the pure decision cores depend only on
`chamber.common.contracts`, `chamber.common.clock` and `chamber.common.priorities`.
"""
