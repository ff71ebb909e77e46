"""A whole run: the run dir, execute (preflight, cells, finish), progress, the credential scan,
the receipt and the report."""
