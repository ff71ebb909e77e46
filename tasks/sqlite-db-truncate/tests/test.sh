#!/bin/bash
# Harbor runs this as /tests/test.sh (output to /logs/verifier/test-stdout.txt) and reads the
# reward from /logs/verifier/reward.txt: 1 when every check passes, else 0.
mkdir -p /logs/verifier
if python3 /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
