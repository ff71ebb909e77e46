"""What the lab reads of task.toml (runner.spec.task_config), in Terminal-Bench 2.0's form and
2.1's, as their real files have it (the bundles in ../shared/sources; tasks/ holds 2.1 copies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.core.errors import InputError
from runner.spec.task_config import read_task_settings

TB20 = """version = "1.0"

[verifier]
timeout_sec = 900.0

[agent]
timeout_sec = 1200.0

[environment]
build_timeout_sec = 450.0
docker_image = "alexgshaw/fix-git:20251031"
cpus = 1
memory = "2G"
storage = "10G"
"""
TB21 = """schema_version = "1.1"
artifacts = []

[task]
name = "terminal-bench/sqlite-db-truncate"

[verifier]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
memory_mb = 2048
allow_internet = false
"""


def task_with(tmp_path: Path, text: str, name: str = "some-task") -> Path:
    task = tmp_path / name
    task.mkdir()
    (task / "task.toml").write_text(text)
    return task


def test_the_20_form_gives_its_version_timeouts_and_harbors_default_network(
    tmp_path: Path,
) -> None:
    settings = read_task_settings(task_with(tmp_path, TB20))
    assert settings.schema_version == "1.0"
    assert (settings.build_timeout_sec, settings.agent_timeout_sec) == (450.0, 1200.0)
    assert settings.verifier_timeout_sec == 900.0
    assert (settings.network, settings.network_from) == (
        "public",
        "Harbor's default (task.toml is silent)",
    )


def test_the_21_form_maps_allow_internet_as_harbor_does(tmp_path: Path) -> None:
    settings = read_task_settings(task_with(tmp_path, TB21))
    assert settings.schema_version == "1.1"
    assert (settings.network, settings.network_from) == ("no-network", "allow_internet = false")
    assert settings.agent_timeout_sec is None


def test_network_mode_wins_over_allow_internet(tmp_path: Path) -> None:
    text = TB21.replace("allow_internet = false", 'allow_internet = false\nnetwork_mode = "public"')
    settings = read_task_settings(task_with(tmp_path, text))
    assert (settings.network, settings.network_from) == ("public", 'network_mode = "public"')


def test_a_task_toml_without_a_build_timeout_gets_harbors_600_s(tmp_path: Path) -> None:
    settings = read_task_settings(task_with(tmp_path, 'version = "1.0"\n'))
    assert settings.build_timeout_sec == 600.0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("version = \n", "task some-task: task.toml cannot be read: "),
        ('environment = "x"\n', "task some-task: task.toml: [environment] is not a table"),
        ("[environment]\nallow_internet = 1\n", "allow_internet must be true or false"),
        ('[environment]\nnetwork_mode = "lan"\n', "task some-task: task.toml: "),
        ("[environment]\nbuild_timeout_sec = -5\n", "task some-task: task.toml: "),
    ],
)
def test_a_bad_task_toml_is_one_line_naming_the_task(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(InputError) as raised:
        read_task_settings(task_with(tmp_path, text))
    assert str(raised.value).startswith(said) or said in str(raised.value)
    assert "\n" not in str(raised.value)


def test_no_task_toml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    with pytest.raises(InputError, match=r"^task bare: no task\.toml$"):
        read_task_settings(tmp_path / "bare")
