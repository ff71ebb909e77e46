"""The distance between the image a FROM names and the one the lab gives it
(runner.spec.base_images), for the names the real Terminal-Bench tasks use."""

from __future__ import annotations

import pytest

from runner.spec.base_images import local_substitute_use, registry_image_use

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
