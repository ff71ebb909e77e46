"""``@lab/<lab>``: pyinfra's SSH connector to a lab's guest, connecting when first used.

The guest's address, port and key are in the lab's lab.json, which the hypervisor side of the
same deploy writes while it prepares, and the guest itself only exists once the hypervisor's
operations have run. So this connector does not connect when pyinfra connects its hosts: it
reads lab.json and connects on the first command (after the shared "Lab guest answers SSH"
operation has waited for the guest). Registered as the ``lab`` connector in pyproject.toml.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyinfra.connectors.ssh import SSHConnector
from typing_extensions import override

from runner.lab.state import LabPaths, load_lab_state

GUEST_GROUP = "lab_guests"


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
        paths = LabPaths.for_lab(self.host.data.lab_guest)
        state = load_lab_state(paths)
        paths.known_hosts.touch()
        self.data.update(
            {
                "ssh_hostname": state.ssh_host,
                "ssh_port": state.ssh_port,
                "ssh_user": state.ssh_user,
                "ssh_key": state.private_key,
                # The guest's host key is made at its first boot: a rebuilt lab has a new one.
                "ssh_known_hosts_file": str(paths.known_hosts),
                "ssh_strict_host_key_checking": "accept-new",
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
