"""A run directory's files and their models: the paths object, the schedule, the ledger."""
