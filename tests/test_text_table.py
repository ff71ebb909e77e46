"""The plain-text table the deploy's failed builds and the freeze's failed oracles print
(runner.core.text_table)."""

from __future__ import annotations

from runner.core.text_table import text_table


def test_each_column_but_the_last_is_padded_to_its_widest_cell() -> None:
    rows = [("sqlite-db-truncate", "build", "E: Unable to locate package sqlite3"), ("a", "b", "")]
    assert text_table(("task", "step", "error"), rows) == [
        "  task                step   error",
        "  sqlite-db-truncate  build  E: Unable to locate package sqlite3",
        "  a                   b      ",
    ]


def test_a_header_wider_than_every_row_sets_the_width_and_no_rows_leave_the_header() -> None:
    assert text_table(("task", "step"), [("x", "oracle")], indent="") == [
        "task  step",
        "x     oracle",
    ]
    assert text_table(("task", "step", "error"), []) == ["  task  step  error"]
