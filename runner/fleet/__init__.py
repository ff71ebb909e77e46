"""Batches on many hosts: Temporal workflows, the hosts' workers, the controller's ledger."""
