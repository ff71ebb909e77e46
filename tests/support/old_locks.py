"""A lock file as it was before fields were added to the format, and the digests it had then.

Fields added later are left out of a model's JSON at their default (FrozenModel.LATE_FIELDS),
so these digests must not move when the format grows.
"""

from __future__ import annotations

from runner.core.roots import REPO_ROOT

# locks/seed-54.toml before [retry], tools.python_index, guest.tool_suites, reference_versions.
SEED_54_BEFORE = REPO_ROOT / "tests" / "fixtures" / "seed-54-before-tool-suites.toml"
SEED_54_BEFORE_FINGERPRINT = (
    "sha256:335d0ef491eabdbe47dccd0b5f395c58742e11b60b03b576cb13e63363abb91f"
)
