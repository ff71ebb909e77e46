#!/bin/bash
# Reference solution: read the secret out of the reflog's history, then expire the reflog and
# prune, so no object (reachable or not) still holds it.
set -euo pipefail
cd /app/repo
git log --all --reflog -p | grep -o 'secret\[[^]]*\]' | sort -u > /app/secret.txt
git reflog expire --expire=now --expire-unreachable=now --all
git gc --quiet --prune=now
cat /app/secret.txt
