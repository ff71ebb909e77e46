#!/bin/bash
# Builds the task's repository at image build time: four commits, one of which leaked a secret
# and was then dropped from history with a reset and a cherry-pick. The dropped commit is still
# in the object store and the reflog. Fixed identities and dates make every commit id the same
# on every build.
set -euo pipefail

repo=$1
export GIT_AUTHOR_NAME="Dana Ops" GIT_AUTHOR_EMAIL="dana@example.invalid"
export GIT_COMMITTER_NAME="Dana Ops" GIT_COMMITTER_EMAIL="dana@example.invalid"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null

commit() {
  export GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1"
  git add -A
  git commit --quiet -m "$2"
}

git init --quiet -b main "$repo"
cd "$repo"

printf '# status-service\n\nA small service that reports its own health.\n' > README.md
commit "2025-03-01T09:00:00Z" "Initial commit: add README"

cat > config.py <<'PY'
import os


def load_settings() -> dict[str, str]:
    """Settings come from the environment; nothing secret lives in the repository."""
    return {"api_url": os.environ.get("API_URL", "http://localhost:8080")}
PY
commit "2025-03-02T09:00:00Z" "Add service config loader"
base=$(git rev-parse HEAD)

printf 'API_URL=https://status.example.invalid\nAPI_TOKEN=secret[7f3e-harbor-leak-91c2]\n' > deploy.env
commit "2025-03-03T09:00:00Z" "Add deployment settings"

cat > app.py <<'PY'
from config import load_settings


def health() -> dict[str, str]:
    return {"status": "ok", "api": load_settings()["api_url"]}
PY
commit "2025-03-04T09:00:00Z" "Add health check endpoint"
leaky_tip=$(git rev-parse HEAD)

# The "history rewrite": drop the deployment-settings commit, keep the one after it.
git reset --quiet --hard "$base"
export GIT_COMMITTER_DATE="2025-03-05T09:00:00Z"
git cherry-pick "$leaky_tip" > /dev/null

printf '\n`health()` returns the service status.\n' >> README.md
commit "2025-03-06T09:00:00Z" "Document the health check"
