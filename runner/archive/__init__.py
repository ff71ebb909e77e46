"""The evidence archive: one signed, credential-scanned tarball of a finished run in a strict tar
subset (tarball.py, tar_format.py), and the reviewer's check of one (check.py), which recomputes
the report from the run's files."""
