"""Checks for sqlite-db-truncate (standard library only; exits non-zero on the first failure)."""

import json
import sys
from pathlib import Path

EXPECTED = json.loads((Path(__file__).parent / "expected.json").read_text())


def recovered_pairs() -> set[tuple[str, object]]:
    path = Path("/app/recover.json")
    assert path.is_file(), "/app/recover.json was not written"
    rows = json.loads(path.read_text())
    assert isinstance(rows, list), "recover.json is not a JSON list"
    assert all(isinstance(row, dict) and {"word", "value"} <= row.keys() for row in rows), (
        "every row needs a word and a value"
    )
    words = [row["word"] for row in rows]
    # One value per word: listing a word many times with guessed values must not count.
    assert len(words) == len(set(words)), "a word appears more than once"
    # The type is part of the value: 4 and 4.0 compare equal in Python, "4" does not.
    return {(row["word"], (type(row["value"]).__name__, row["value"])) for row in rows}


def every_surviving_row_recovered() -> None:
    wanted = {(row["word"], (type(row["value"]).__name__, row["value"])) for row in EXPECTED}
    missing = wanted - recovered_pairs()
    assert not missing, f"{len(missing)} of {len(wanted)} recoverable rows missing or wrong"


if __name__ == "__main__":
    try:
        every_surviving_row_recovered()
    except (AssertionError, ValueError, OSError) as failure:
        print(f"FAIL: {failure}")
        sys.exit(1)
    print(f"PASS: all {len(EXPECTED)} recoverable rows recovered")
