"""A whole run: the run dir, execute (preflight, cells, finish) and its progress; the credential
scan (runner.scan), the report (runner.report) and the archive (runner.archive) are rooms of their
own."""
