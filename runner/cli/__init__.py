"""The ``runner`` command: one module per verb; the only place that knows click and turns
errors into one line and an exit code."""
