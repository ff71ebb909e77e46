#!/bin/bash
# Scripted wrong answer for the demo: scrapes the words out of the raw bytes but cannot read
# their binary-encoded values, so it writes every word with value 0. The verifier must give
# this reward 0.
set -euo pipefail
python3 - <<'PY'
import json
import re

words = sorted(set(re.findall(rb"testword\d+", open("/app/trunc.db", "rb").read())))
json.dump([{"word": w.decode(), "value": 0} for w in words], open("/app/recover.json", "w"))
PY
