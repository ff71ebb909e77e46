"""Makes environment/trunc.db and tests/expected.json (run once by hand; both are committed).

A table of 60 (word, value) rows in 512-byte pages, then the file cut after its fourth page:
the rows on the pages that are gone are lost, the rest can be read back from the raw b-tree
leaf pages. Values mix small and large integers and floats so that a recovery must decode
SQLite's record serial types, not guess them. The database is made once and committed, so the
task does not depend on the guest's SQLite version laying pages out the same way.
"""

import json
import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP_PAGES = 4
PAGE_SIZE = 512


def rows() -> list[tuple[str, int | float]]:
    values: list[int | float] = []
    for i in range(60):
        kind = i % 4
        values.append([i + 1, 1000 + 37 * i, 250000 + 9973 * i, round(i * 1.25 + 0.5, 2)][kind])
    return [(f"testword{i:02d}", value) for i, value in enumerate(values)]


def main() -> None:
    database = HERE / "environment" / "trunc.db"
    database.unlink(missing_ok=True)
    connection = sqlite3.connect(database)
    connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    connection.execute("CREATE TABLE words (word TEXT, value)")
    connection.executemany("INSERT INTO words VALUES (?, ?)", rows())
    connection.commit()
    connection.close()
    data = database.read_bytes()
    kept = data[: KEEP_PAGES * PAGE_SIZE]
    database.write_bytes(kept)
    # A row survives when its word is still in the kept bytes (each word is stored once).
    surviving = [{"word": word, "value": value} for word, value in rows() if word.encode() in kept]
    listing = ",\n".join(json.dumps(row) for row in surviving)
    (HERE / "tests" / "expected.json").write_text(f"[\n{listing}\n]\n")
    print(
        f"{len(data)} bytes cut to {len(kept)}; {len(surviving)} of {len(rows())} rows survive",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
