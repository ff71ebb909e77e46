"""``@lab/<lab>``: pyinfra's SSH connector to a lab's guest, connecting when first used.

The guest's address, port and key are in the lab's lab.json, which the hypervisor side of the
same deploy writes while it prepares, and the guest itself only exists once the hypervisor's
operations have run. So this connector does not connect when pyinfra connects its hosts: it
reads lab.json and connects on the first command (after the shared "Lab guest answers SSH"
operation has waited for the guest and pinned its host key). Registered as the ``lab``
connector in pyproject.toml.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyinfra.connectors.ssh import SSHConnector
from typing_extensions import override

from deploy.errors import one_line_errors
from runner.lab.host_key import write_known_hosts
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import PARAMIKO_WAITS

GUEST_GROUP = "lab_guests"
CONNECT_RETRIES = 5


class LabGuestConnector(SSHConnector):
    @override
    @staticmethod
    def make_names_data(name: str) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
        yield f"@lab/{name}", {"lab_guest": name}, [GUEST_GROUP]

    @override
    def connect(self) -> None:
        """Deferred to the first command (see the module docstring)."""

    def _connect_to_lab(self) -> None:
        if self.client is not None:
            return
        with one_line_errors():
            lab = load_lab_state(LabPaths.for_lab(self.host.data.lab_guest))
            paths = write_known_hosts(lab)
        # Strict against the host key lab.json pins, written to the lab's known_hosts: the
        # only file pyinfra reads keys from here.
        self.data.update(
            {
                "ssh_hostname": lab.ssh_host,
                "ssh_port": lab.ssh_port,
                "ssh_user": lab.ssh_user,
                "ssh_key": lab.private_key,
                "ssh_known_hosts_file": str(paths.known_hosts),
                "ssh_strict_host_key_checking": "yes",
                "ssh_paramiko_connect_kwargs": dict(PARAMIKO_WAITS),
                # A dropped or slow handshake is tried again (a changed host key is not: pyinfra
                # raises it as a connect error, which it never retries).
                "ssh_connect_retries": CONNECT_RETRIES,
                "ssh_connect_retry_min_delay": 3.0,
                "ssh_connect_retry_max_delay": 8.0,
            }
        )
        super().connect()

    @override
    def run_shell_command(self, *args: Any, **kwargs: Any) -> Any:
        self._connect_to_lab()
        return super().run_shell_command(*args, **kwargs)

    @override
    def put_file(self, *args: Any, **kwargs: Any) -> Any:
        self._connect_to_lab()
        return super().put_file(*args, **kwargs)

    @override
    def get_file(self, *args: Any, **kwargs: Any) -> Any:
        self._connect_to_lab()
        return super().get_file(*args, **kwargs)
