"""Checks for git-leak-recovery (standard library only; exits non-zero on the first failure)."""

import hashlib
import subprocess
import sys
from pathlib import Path

REPO = Path("/app/repo")
SECRET = "secret[7f3e-harbor-leak-91c2]"
SUBJECTS = [
    "Document the health check",
    "Add health check endpoint",
    "Add service config loader",
    "Initial commit: add README",
]
FILES = {
    "README.md": "7aef17089ce24b7aa130fb29d988576bb75cf1dd64e6ecac00b9dc5b23b7ccf6",
    "app.py": "89e7513e15d5064d54199d487673fe86fa2aa874d6939e3e9f07d75bd5074bb0",
    "config.py": "1ad56959d352f0fa61cb7256a67c5c0414d50e54f03d88b8f4aec1fad56bd7e3",
}


def git(*args: str) -> bytes:
    return subprocess.run(
        ["git", "-c", f"safe.directory={REPO}", "-C", str(REPO), *args],
        check=True,
        capture_output=True,
    ).stdout


def secret_recovered() -> None:
    found = Path("/app/secret.txt")
    assert found.is_file(), "/app/secret.txt was not written"
    assert found.read_text().strip() == SECRET, "/app/secret.txt does not hold the secret"


def no_object_holds_secret() -> None:
    # Every object in the store, reachable or not, loose or packed.
    assert SECRET.encode() not in git("cat-file", "--batch-all-objects", "--batch"), (
        "an object in the repository still holds the secret"
    )


def no_file_holds_secret() -> None:
    # Working tree, reflogs, refs, lost-found: any file under the repository.
    for path in REPO.rglob("*"):
        if path.is_file() and SECRET.encode() in path.read_bytes():
            raise AssertionError(f"{path} still holds the secret")


def history_kept() -> None:
    subjects = git("log", "--format=%s", "HEAD").decode().splitlines()
    assert subjects == SUBJECTS, f"commit messages changed: {subjects}"


def files_kept() -> None:
    tracked = sorted(git("ls-tree", "-r", "--name-only", "HEAD").decode().split())
    assert tracked == sorted(FILES), f"tracked files changed: {tracked}"
    for name, digest in FILES.items():
        assert hashlib.sha256(git("show", f"HEAD:{name}")).hexdigest() == digest, name
        assert hashlib.sha256((REPO / name).read_bytes()).hexdigest() == digest, name


def repository_intact() -> None:
    git("fsck", "--no-dangling")


CHECKS = [
    secret_recovered,
    no_object_holds_secret,
    no_file_holds_secret,
    history_kept,
    files_kept,
    repository_intact,
]

if __name__ == "__main__":
    for check in CHECKS:
        try:
            check()
        except (AssertionError, subprocess.CalledProcessError, OSError) as failure:
            print(f"FAIL {check.__name__}: {failure}")
            sys.exit(1)
        print(f"PASS {check.__name__}")
