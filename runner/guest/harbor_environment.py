"""Harbor's Docker environment (Podman's Docker API in the guest) as the frozen lab runs it
(``runner.guest.harbor_environment:FrozenLabEnvironment``, Harbor's ``--env``).

Every cell starts from the same frozen guest, so work that would come out the same in every cell
is not repeated in each one (measured under TCG: bench/cell_phases.py):

- the task's image is the one provisioning built from the task's ``environment/`` and froze
  (``GUEST.task_image``): Harbor's own ``compose build`` of the same Dockerfile found each of
  its layers in Podman's cache and only re-tagged it, at the cost of a build under emulation;
- no clean-up of stale containers before the start: the frozen guest has none;
- no check of the image's OS (a ``docker inspect``): provisioning built it, for Linux;
- no chown of the logs' bind mounts to Harbor's user after the agent (an exec per mount, ~5 s
  each under TCG): Harbor runs as root in the guest against rootful Podman, and reads them
  whoever owns them (a Harbor run as another user still gets Harbor's own chown);
- with ``leave_for_reset`` (a run that resets the guest before every cell), the containers are
  left for that reset at the end of the trial instead of stopped and removed: the reset
  discards them with the rest of the cell's state. Without it (``runner execute --no-reset``)
  the trial ends as Harbor's own does.

The task container itself is created and started in every cell, by Harbor, from that image:
the agent always starts in a fresh container.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult
from harbor.environments.docker.docker import DockerEnvironment

from runner.core.models import updated
from runner.guest.task_images import task_image

# Harbor's clean-up of a session's stale containers before `compose up` (its start()).
_STALE_CLEANUP = ["down", "--remove-orphans"]


class FrozenLabEnvironment(DockerEnvironment):
    def __init__(
        self,
        *,
        environment_dir: Path,
        task_env_config: Any,
        leave_for_reset: bool = False,
        **kwargs: Any,
    ) -> None:
        # Harbor's factory passes everything by name; environment_dir is /srv/tasks/<task>/...
        image = task_image(environment_dir.parent.name)
        super().__init__(
            environment_dir=environment_dir,
            task_env_config=updated(task_env_config, docker_image=image),
            **kwargs,
        )
        self._leave_for_reset = leave_for_reset

    async def _run_docker_compose_command(
        self, command: list[str], *args: Any, **kwargs: Any
    ) -> ExecResult:
        if command == _STALE_CLEANUP:
            return ExecResult(stdout="", stderr="", return_code=0)
        return await super()._run_docker_compose_command(command, *args, **kwargs)

    async def _validate_image_os(self, image_name: str) -> None:
        return None

    async def prepare_logs_for_host(self) -> None:
        if os.getuid() != 0:
            await super().prepare_logs_for_host()

    async def stop(self, delete: bool) -> None:
        if not self._leave_for_reset:
            await super().stop(delete)
