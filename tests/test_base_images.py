"""The distance between the image a FROM names and the one the lab gives it
(runner.spec.base_images), for the names the real Terminal-Bench tasks use."""

from __future__ import annotations

import pytest

from runner.spec.base_images import (
    base_recipe,
    built_image_use,
    local_substitute_use,
    registry_image_use,
)
from runner.spec.lock import TaskSource

USERLAND = "the guest's own userland: its package database, tools and Python packaging"


@pytest.mark.parametrize(
    ("from_name", "named", "differs"),
    [
        ("ubuntu:24.04", "Ubuntu 24.04", ("distribution: Ubuntu named, Debian used",)),
        (
            "python:3.13-slim-bookworm",
            "Python 3.13 on Debian 12 (bookworm)",
            ("Debian release: 12 (bookworm) named, 13 (trixie) used",),
        ),
        (
            "python:3.11-slim",
            "Python 3.11 on Debian (release not in the tag)",
            ("Python: 3.11 named, 3.13 used",),
        ),
        ("debian:13.0-slim", "Debian 13.0 (trixie)", ()),
        (
            "docker.io/library/debian:bookworm-slim",
            "Debian 12 (bookworm)",
            ("Debian release: 12 (bookworm) named, 13 (trixie) used",),
        ),
        (
            "bench-base",
            "not known from its name",
            ("the named image's distribution is not known from its name",),
        ),
    ],
)
def test_a_local_substitute_says_how_far_it_is_from_the_named_image(
    from_name: str, named: str, differs: tuple[str, ...]
) -> None:
    use = local_substitute_use(from_name, "localhost/base:1", "trixie")
    assert (use.named, use.kind) == (named, "local substitute")
    assert use.used == "Python 3.13 on Debian 13 (trixie), the guest's own userland"
    assert use.differs == (*differs, USERLAND)


def test_a_bookworm_guest_is_the_nearest_for_python_311_on_bookworm() -> None:
    use = local_substitute_use("python:3.11-slim-bookworm", "localhost/base:1", "bookworm")
    assert use.used.startswith("Python 3.11 on Debian 12 (bookworm)")
    assert use.differs == (USERLAND,)


def test_a_registry_image_pinned_by_digest_is_the_image_itself() -> None:
    image = f"127.0.0.1:5000/library/python@sha256:{'a' * 64}"
    use = registry_image_use("python:3.12-slim", image)
    assert (use.kind, use.differs) == ("registry image pinned by digest", ())
    assert use.named == "Python 3.12 on Debian (release not in the tag)"


@pytest.mark.parametrize(
    ("from_name", "recipe_id", "python"),
    [
        ("python:3.11-slim", "python-3.11-bookworm", True),
        ("python:3.11-slim-bookworm", "python-3.11-bookworm", True),
        # bookworm has no 3.13: the release whose python3 is the named one.
        ("python:3.13-slim-bookworm", "python-3.13-trixie", True),
        ("python:3.9-slim", "python-3.9-bullseye", True),
        ("debian:13.0-slim", "debian-trixie", False),
        ("docker.io/library/debian:bookworm-slim", "debian-bookworm", False),
        ("ubuntu:24.04", "debian-trixie", False),
    ],
)
def test_a_from_name_is_built_as_the_debian_release_and_python_it_says(
    from_name: str, recipe_id: str, python: bool
) -> None:
    recipe = base_recipe(from_name)
    assert recipe is not None
    assert (recipe.id, recipe.python) == (recipe_id, python)
    assert recipe.image == f"localhost/bench-base/{recipe_id}:built"
    assert "python3" in recipe.packages
    assert ("python3-pip" in recipe.packages) is python


def test_names_no_recipe_reads_are_not_built() -> None:
    assert base_recipe("bench-base") is None
    assert base_recipe("alpine:3.20") is None


def test_a_built_image_names_each_way_it_differs_from_the_named_one() -> None:
    python311 = base_recipe("python:3.11-slim")
    assert python311 is not None
    use = built_image_use("python:3.11-slim", python311)
    assert (use.kind, use.image) == ("built from Debian", python311.image)
    assert use.used.startswith("Python 3.11 on Debian 12 (bookworm)")
    assert not any("Python:" in line or "release" in line for line in use.differs)
    ubuntu = base_recipe("ubuntu:24.04")
    assert ubuntu is not None
    lines = built_image_use("ubuntu:24.04", ubuntu).differs
    assert lines[0] == "distribution: Ubuntu named, Debian used (the nearest release)"
    assert any(line.startswith("python3 3.13 added") for line in lines)
    bookworm_313 = base_recipe("python:3.13-slim-bookworm")
    assert bookworm_313 is not None
    lines = built_image_use("python:3.13-slim-bookworm", bookworm_313).differs
    assert lines[0] == "Debian release: 12 (bookworm) named, 13 (trixie) used"


def test_a_lock_refuses_build_for_a_name_no_recipe_reads() -> None:
    with pytest.raises(ValueError, match=r"alpine:3\.20 = 'build': no recipe reads this name"):
        TaskSource(path="tasks", ids=("x",), base_images={"alpine:3.20": "build"})
    source = TaskSource(
        path="tasks",
        ids=("x",),
        base_images={"ubuntu:24.04": "build", "debian:13.0-slim": "build", "b": "localhost/b:1"},
    )
    ((recipe, names),) = source.built_images
    assert (recipe.id, names) == ("debian-trixie", ("ubuntu:24.04", "debian:13.0-slim"))
    assert source.local_images == {"b": "localhost/b:1"}
