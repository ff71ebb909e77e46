"""The guest's host key: read from its console, pinned in lab.json, and every client of the lab
(SshTransport, pyinfra's connector, Ansible's ssh) refusing a guest whose key changed, each
against a loopback sshd (tests/support/loopback_sshd.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from pyinfra.api.config import Config
from pyinfra.api.exceptions import ConnectError
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from runner.core.files import read_model, write_model
from runner.core.roots import CACHE_ENV
from runner.lab.host_key import HostKeyError, host_key_in_console, pin_host_key
from runner.lab.state import LabPaths, LabState
from runner.lab.transport import SshTransport
from runner.verify.audit import ANSIBLE_ENV, refuse_changed_host_key, ssh_host_vars
from tests.support.loopback_sshd import (
    LoopbackSshd,
    loopback_lab,
    loopback_sshd,
    make_ed25519_key,
    public_line,
)

LAB = "keyed"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, paramiko.Ed25519Key]:
    """The guest's host key, the one a remade (or impostor) guest offers, and root's key."""
    (tmp_path / "keys").mkdir()
    return {name: make_ed25519_key(tmp_path / "keys" / name) for name in ("host", "other", "root")}


@pytest.fixture
def sshd(keys: dict[str, paramiko.Ed25519Key]) -> Iterator[LoopbackSshd]:
    with loopback_sshd(keys["host"]) as server:
        yield server


@pytest.fixture
def lab(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sshd: LoopbackSshd,
    keys: dict[str, paramiko.Ed25519Key],
) -> LabState:
    """A lab whose lab.json pins the loopback sshd's host key (in a cache of the test's own)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    state = loopback_lab(LAB, sshd.port, tmp_path / "keys" / "root", public_line(keys["host"]))
    write_model(LabPaths.for_lab(LAB).state, state)
    return state


# --- captured from the console -------------------------------------------------------------

# Two guests' public keys (made by ssh-keygen once; their private halves are gone).
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKr1sp++/UTNo/StR5m6PDU6z4jtSR5uLGLXfSJIm1zM"
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK6e7jTGQNbBOqulS4uLVdnRGXQow6hZbxaaGfhLeftG"


def test_the_last_whole_key_line_of_the_console_is_the_guest_key() -> None:
    console = (
        f"[    1.0] Booting\r\nlab.host_key={OTHER_KEY}\r\n[    2.0] reboot\r\n"
        f"lab.host_key={KEY}\r\n"
        # a line the kernel's own output broke: not a key
        "lab.host_key=ssh-ed25519 AAAAC3Nz[    3.1] virtio_net\r\n"
        "Debian GNU/Linux benchvm ttyAMA0\r\n"
    )
    assert host_key_in_console(console) == KEY
    assert host_key_in_console("no marker here\n") is None


def test_pinning_writes_lab_json_and_known_hosts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    paths = LabPaths.for_lab(LAB)
    unpinned = loopback_lab(LAB, 2222, tmp_path / "root", None)
    pinned = pin_host_key(unpinned, f"boot\nlab.host_key={KEY}\n")
    assert read_model(paths.state, LabState).ssh_host_key == KEY == pinned.ssh_host_key
    assert paths.known_hosts.read_text() == f"[127.0.0.1]:2222 {KEY}\n"
    # A second boot's console (a remade guest on the same port) does not move the pin.
    assert pin_host_key(pinned, f"lab.host_key={OTHER_KEY}\n").ssh_host_key == KEY


def test_a_console_without_the_key_line_is_one_error_naming_the_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(HostKeyError, match=f"^lab {LAB}: .* printed no lab.host_key= line"):
        pin_host_key(loopback_lab(LAB, 2222, tmp_path / "root", None), "Debian GNU/Linux\n")


def test_a_lab_that_pins_no_key_has_no_transport(tmp_path: Path) -> None:
    with pytest.raises(HostKeyError, match=f"^lab {LAB}: lab.json pins no SSH host key"):
        SshTransport.for_lab(loopback_lab(LAB, 2222, tmp_path / "root", None))


# --- every client refuses a changed key ----------------------------------------------------


def test_ssh_transport_reaches_the_guest_with_its_pinned_key(lab: LabState) -> None:
    with SshTransport.for_lab(lab).connect() as guest:
        # More than one packet and past 8,192 bytes (commit 9aaea26), and stderr apart.
        result = guest.exec("head -c 200000 /dev/zero | tr '\\0' a; echo done >&2; exit 3")
    assert (result.exit_code, len(result.stdout), result.stderr) == (3, 200000, "done\n")


def test_ssh_transport_refuses_a_changed_key_at_once(
    lab: LabState, sshd: LoopbackSshd, keys: dict[str, paramiko.Ed25519Key]
) -> None:
    sshd.host_key = keys["other"]
    with pytest.raises(HostKeyError) as raised:
        SshTransport.for_lab(lab).connect(wait_seconds=60)
    message = str(raised.value)
    assert message.startswith(f"lab {LAB}: the guest at 127.0.0.1:{sshd.port} offered SSH host key")
    assert keys["other"].fingerprint in message and keys["host"].fingerprint in message
    assert "\n" not in message and raised.value.__cause__ is None
    assert len(sshd._transports) == 1  # refused, not retried for the minute it may wait


def _pyinfra_guest() -> tuple[State, object]:
    state = State(Inventory(([f"@lab/{LAB}"], {})), Config())  # type: ignore[no-untyped-call]
    return state, state.inventory.get_host(f"@lab/{LAB}")


def test_pyinfra_connector_reaches_the_guest_with_its_pinned_key(lab: LabState) -> None:
    _, host = _pyinfra_guest()
    connector = host.connector  # type: ignore[attr-defined]
    connector._connect_to_lab()
    assert connector.data["ssh_strict_host_key_checking"] == "yes"
    assert connector.data["ssh_known_hosts_file"] == str(LabPaths.for_lab(LAB).known_hosts)
    channel = connector.client.get_transport().open_session()
    channel.exec_command("echo answered")
    assert channel.makefile().read() == b"answered\n"


def test_pyinfra_connector_refuses_a_changed_key(
    lab: LabState, sshd: LoopbackSshd, keys: dict[str, paramiko.Ed25519Key]
) -> None:
    sshd.host_key = keys["other"]
    _, host = _pyinfra_guest()
    with pytest.raises(ConnectError, match="SSH host key error"):
        host.connector._connect_to_lab()  # type: ignore[attr-defined]
    assert sshd.connections == 1  # refused at once, never tried again


def test_pyinfra_connector_tries_a_dropped_handshake_again(
    lab: LabState, sshd: LoopbackSshd
) -> None:
    sshd.drop_first = 1  # what CI's smoke deploy met: "Error reading SSH protocol banner"
    _, host = _pyinfra_guest()
    host.connector._connect_to_lab()  # type: ignore[attr-defined]
    assert sshd.connections == 2


def test_ansible_refuses_a_changed_key_and_reaches_the_pinned_one(
    lab: LabState, keys: dict[str, paramiko.Ed25519Key], tmp_path: Path
) -> None:
    """Two labs in one ``ansible -m ping`` (ansible's start is most of its time): this one's
    guest offers its pinned key, the other's (same pin) a changed one."""
    with loopback_sshd(keys["other"]) as changed:
        remade = loopback_lab("remade", changed.port, Path(lab.private_key), lab.ssh_host_key)
        hosts = {"pinned": ssh_host_vars(lab), "changed": ssh_host_vars(remade)}
        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
        env = {
            **os.environ,
            **ANSIBLE_ENV,
            "ANSIBLE_SSH_ARGS": "",  # no ControlPersist master left running after the test
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        }
        ansible = Path(sys.executable).parent / "ansible"
        result = subprocess.run(
            [str(ansible), "all", "-i", str(inventory), "-m", "ping"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    said = result.stdout + result.stderr
    assert "pinned | SUCCESS" in result.stdout, said
    assert "changed | UNREACHABLE" in result.stdout, said
    assert "Host key verification failed" in result.stdout, said


def test_the_audit_stops_with_one_line_naming_the_lab_when_ssh_refused_the_guest(
    tmp_path: Path,
) -> None:
    said = "Failed to connect to the host via ssh: Host key verification failed."
    events = [
        {"event": "playbook_on_start"},
        {"event": "runner_on_unreachable", "event_data": {"res": {"msg": said}}},
    ]
    with pytest.raises(HostKeyError, match=f"^lab {LAB}: ssh refused the guest"):
        refuse_changed_host_key(LAB, events, tmp_path)
    refuse_changed_host_key(LAB, events[:1], tmp_path)  # no refusal: nothing raised
