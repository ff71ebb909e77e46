"""Our one-line errors, shown by pyinfra as one line too (not as a traceback): raised while the
deploy is prepared, or by a controller-side command while it executes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import libvirt
from pyinfra import logger
from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.state import State
from typing_extensions import override

from runner.core.errors import RunnerError


@contextmanager
def one_line_errors() -> Iterator[None]:
    try:
        yield
    except RunnerError as error:
        raise PyinfraError(str(error)) from None


class ControllerCommand(FunctionCommand):
    """A function run on the controller as an operation's command. Its expected failures (ours,
    libvirt's) fail the operation with their one line; pyinfra would log a traceback for them."""

    @override
    def execute(self, state: State, host: Host, connector_arguments: ConnectorArguments) -> Any:
        try:
            return super().execute(state, host, connector_arguments)
        except (RunnerError, libvirt.libvirtError) as error:
            host.log_styled(str(error), fg="red", log_func=logger.error)
            return False
