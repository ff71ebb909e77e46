"""The credential scan: of the run directory (scan.py) and of the guest's disk after each attempt
(guest_disk.py), through every compressed layer of a file (layers.py, its kinds told by
layer_kinds.py)."""
