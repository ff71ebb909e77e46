"""Each category's guest command as the audit playbook runs it: the playbook observes several
categories in one task (runner.freeze.live.concurrent_command); this takes that task apart."""

from __future__ import annotations

from typing import Any


def commands_of(play: dict[str, Any]) -> dict[str, str]:
    """category -> the command its part of an observing task runs."""
    commands: dict[str, str] = {}
    for task in play["tasks"]:
        for part in task.get("ansible.builtin.raw", "").split("exec {fd_")[1:]:
            body = part.split("< <( (set -o pipefail; ", 1)[1]
            command, tail = body.rsplit("\n); printf ", 1)
            name = tail.split('"$?" ', 1)[1].split(")", 1)[0].strip("'")
            commands[name] = command
    return commands
