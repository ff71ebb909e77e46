#!/bin/bash
# Reference solution: the file ends mid-table, so SQLite refuses it. Read the b-tree leaf pages
# that are still there by hand: every table-leaf cell is a record whose header gives each
# column's serial type; the word/value rows are the two-column records.
set -euo pipefail
python3 - <<'PY'
import json
import struct

data = open("/app/trunc.db", "rb").read()
page_size = struct.unpack(">H", data[16:18])[0]
page_size = 65536 if page_size == 1 else page_size


def varint(buf, at):
    value = 0
    for i in range(9):
        byte = buf[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    raise ValueError("bad varint")


def column(serial, buf, at):
    if serial == 0:
        return None, at
    if 1 <= serial <= 6:
        size = (1, 2, 3, 4, 6, 8)[serial - 1]
        return int.from_bytes(buf[at:at + size], "big", signed=True), at + size
    if serial == 7:
        return struct.unpack(">d", buf[at:at + 8])[0], at + 8
    if serial in (8, 9):
        return serial - 8, at
    size = (serial - 12) // 2 if serial % 2 == 0 else (serial - 13) // 2
    raw = buf[at:at + size]
    return (raw if serial % 2 == 0 else raw.decode("utf-8", "replace")), at + size


def leaf_records(page_number):
    start = (page_number - 1) * page_size
    header = start + (100 if page_number == 1 else 0)
    if data[header] != 0x0D:  # not a table b-tree leaf page
        return
    cells = struct.unpack(">H", data[header + 3:header + 5])[0]
    for i in range(cells):
        pointer = struct.unpack(">H", data[header + 8 + 2 * i:header + 10 + 2 * i])[0]
        at = start + pointer
        _, at = varint(data, at)  # payload size
        _, at = varint(data, at)  # rowid
        header_size, body = varint(data, at)
        header_end = at + header_size
        serials = []
        while body < header_end:
            serial, body = varint(data, body)
            serials.append(serial)
        values, body = [], header_end
        for serial in serials:
            value, body = column(serial, data, body)
            values.append(value)
        yield values


rows = []
for page in range(1, len(data) // page_size + 1):
    for values in leaf_records(page):
        if len(values) == 2 and isinstance(values[0], str):
            rows.append({"word": values[0], "value": values[1]})
json.dump(rows, open("/app/recover.json", "w"), indent=1)
print(f"recovered {len(rows)} rows")
PY
