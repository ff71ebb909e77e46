#!/bin/bash
# Scripted wrong answer for the demo: recovers the secret but never scrubs it, so the
# unreachable commit still holds it. The verifier must give this reward 0.
set -euo pipefail
cd /app/repo
git log --all --reflog -p | grep -o 'secret\[[^]]*\]' | sort -u > /app/secret.txt
