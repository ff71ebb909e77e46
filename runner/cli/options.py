"""Options more than one verb takes."""

from __future__ import annotations

import click

from runner.lab.state import lab_name_from_env

lab_option = click.option(
    "--lab",
    default=lab_name_from_env,
    show_default="$LAB, else default",
    help="The lab to act on.",
)
