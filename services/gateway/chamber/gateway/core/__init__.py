"""Pure views the API serves, computed from inventory, ledger and job records."""
