"""The libvirt facts, operations and teardown against libvirt's test driver (in-process, fast).

Operation cases are data files in tests/deploy_libvirt/, one test each: the state ``given``
(named set-up steps), the operation and its arguments, then the work it must yield, or the error
it must raise; a second run must yield nothing and say so (``noop_after``); ``then`` is what the
facts must read afterwards.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import libvirt
import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host

from deploy.acceleration import choose_acceleration
from deploy.domain_xml import (
    QEMU_NAMESPACE,
    DomainDefinition,
    DomainSpec,
    lab_uuid,
    render_domain,
)
from deploy.facts.libvirt import Domain, StoragePool, StorageVolume
from deploy.operations import libvirt as libvirt_ops
from deploy.operations.guest import wait_for_guest
from runner.core.errors import RunnerError
from runner.core.files import write_model
from runner.core.roots import CACHE_ENV
from runner.lab import libvirt as virt
from runner.lab.state import Acceleration, ImageRef, LabPaths, LabState
from runner.lab.teardown import remove_orphaned_lab, teardown_lab
from runner.lab.transport import GuestError
from tests.support.deploy_harness import local_host, yielded
from tests.support.domain_spec import DOMAIN, LAB, POOL, SPEC

CASES = sorted((Path(__file__).parent / "deploy_libvirt").glob("*.json"))


def for_test_driver(spec: DomainSpec) -> DomainDefinition:
    """The rendered definition, as the test driver takes it (type 'test', an i686 guest)."""
    definition = render_domain(spec)
    root = ET.fromstring(definition.xml)
    root.set("type", "test")
    os_type = root.find("os/type")
    assert os_type is not None
    os_type.attrib = {"arch": "i686"}
    return replace(definition, xml=ET.tostring(root, encoding="unicode"))


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """A fresh, empty test-driver hypervisor per test (``test:///default`` would be shared)."""
    node = tmp_path / "node.xml"
    node.write_text("<node/>")
    return f"test://{node}"


@pytest.fixture
def conn(uri: str) -> libvirt.virConnect:
    return virt.connect(uri)


@pytest.fixture
def pyinfra_host(uri: str) -> Host:
    return local_host({"libvirt_uri": uri})


def run_op(host: Host, op: Any, **args: Any) -> list[str]:
    """Run one operation as pyinfra would at execute time; the names of the work it did."""
    done = []
    for command in yielded(host, op, **args):
        assert isinstance(command, FunctionCommand)
        command.function(*command.args, **command.kwargs)
        done.append(command.function.__name__)
    return done


GIVEN: dict[str, Callable[[libvirt.virConnect, str], None]] = {
    "lab_pool": lambda conn, uri: libvirt_ops._create_pool(uri, POOL, "/pools/t"),
    "stop_pool": lambda conn, uri: conn.storagePoolLookupByName(POOL).destroy(),
    "overlay": lambda conn, uri: libvirt_ops._create_overlay(
        uri, POOL, f"{DOMAIN}.qcow2", "/pools/t/base.qcow2", 1 << 30
    ),
    "define_domain": lambda conn, uri: libvirt_ops._define(uri, for_test_driver(SPEC).xml),
    "start_domain": lambda conn, uri: libvirt_ops._start(uri, DOMAIN),
    "pause_domain": lambda conn, uri: conn.lookupByName(DOMAIN).suspend(),
    "foreign_domain": lambda conn, uri: conn.defineXML(
        f"<domain type='test'><name>{DOMAIN}</name><memory>65536</memory>"
        "<os><type>hvm</type></os></domain>"
    ),
}

FACTS: dict[str, Callable[[libvirt.virConnect], Mapping[str, Any]]] = {
    "pool": lambda conn: StoragePool().read(conn, pool=POOL),
    "volume": lambda conn: StorageVolume().read(conn, pool=POOL, volume=f"{DOMAIN}.qcow2"),
    "domain": lambda conn: Domain().read(conn, domain=DOMAIN),
}


@pytest.mark.parametrize("case_path", CASES, ids=[path.stem for path in CASES])
def test_operation_case(
    case_path: Path,
    conn: libvirt.virConnect,
    uri: str,
    pyinfra_host: Host,
    caplog: pytest.LogCaptureFixture,
) -> None:
    case = json.loads(case_path.read_text())
    for step in case["given"]:
        GIVEN[step](conn, uri)
    op = getattr(libvirt_ops, case["op"])
    args = case.get("args") or {
        "definition": for_test_driver(replace(SPEC, **case.get("spec", {})))
    }

    if "error" in case:
        with pytest.raises(OperationError, match=re.escape(case["error"])):
            run_op(pyinfra_host, op, **args)
        return

    assert run_op(pyinfra_host, op, **args) == case["changes"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        assert run_op(pyinfra_host, op, **args) == []
    assert case["noop_after"] in caplog.text
    for fact, expected in case["then"].items():
        read = FACTS[fact](conn)
        assert {key: read[key] for key in expected} == expected


def test_facts_of_absent_objects_have_the_one_shape(conn: libvirt.virConnect) -> None:
    assert StoragePool().read(conn, pool="nope") == StoragePool().default()
    assert StorageVolume().read(conn, pool="nope", volume="v") == StorageVolume().default()
    assert Domain().read(conn, domain="nope") == {
        "state": "absent",
        "ours": False,
        "lab": "",
        "defined_spec": "",
        "running_spec": "",
    }


def test_domain_fact_reads_both_spec_digests(conn: libvirt.virConnect, uri: str) -> None:
    old = for_test_driver(SPEC)
    libvirt_ops._define(uri, old.xml)
    libvirt_ops._start(uri, DOMAIN)
    new = for_test_driver(replace(SPEC, vcpus=1))
    libvirt_ops._define(uri, new.xml)
    read = Domain().read(conn, domain=DOMAIN)
    assert (read["defined_spec"], read["running_spec"]) == (new.spec_digest, old.spec_digest)


def test_unreachable_libvirt_is_one_error_line() -> None:
    with pytest.raises(
        virt.LibvirtUnreachable, match=re.escape("cannot reach libvirt at test:///nope.xml")
    ):
        virt.connect("test:///nope.xml")


@pytest.mark.parametrize(("arch", "machine"), [("aarch64", "virt"), ("x86_64", "q35")])
def test_domain_xml_follows_the_guest_arch(arch: str, machine: str) -> None:
    root = ET.fromstring(render_domain(replace(SPEC, arch=arch)).xml)  # type: ignore[arg-type]
    assert root.find("os/type").attrib == {"arch": arch, "machine": machine}  # type: ignore[union-attr]
    assert root.get("type") == "qemu"
    assert root.findtext("uuid") == lab_uuid(LAB) != lab_uuid("other")


def test_domain_xml_carries_key_forwards_and_lock_sizes() -> None:
    root = ET.fromstring(render_domain(replace(SPEC, memory_mib=3072, vcpus=2)).xml)
    cmdline = root.findtext("os/cmdline", default="")
    assert cmdline.startswith("root=LABEL=root rw console=ttyAMA0 lab.authorized_key=")
    key = base64.b64decode(cmdline.rsplit("lab.authorized_key=", 1)[1]).decode()
    assert key == SPEC.public_key_line.strip()
    arguments = [arg.get("value", "") for arg in root.iter(f"{{{QEMU_NAMESPACE}}}arg")]
    assert arguments[1] == (
        "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22,"
        "guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:40080"
    )
    assert "romfile=" in arguments[3] and "addr=0x1e" in arguments[3]
    assert (root.findtext("memory"), root.findtext("vcpu")) == ("3072", "2")
    assert root.findtext("cpu/model") == "cortex-a57"


def test_spec_digest_is_stable_and_tracks_changes() -> None:
    assert render_domain(SPEC).spec_digest == render_domain(SPEC).spec_digest
    assert render_domain(SPEC).spec_digest != render_domain(replace(SPEC, ssh_port=1)).spec_digest


def test_acceleration_is_tcg_when_host_arch_differs(conn: libvirt.virConnect) -> None:
    chosen = choose_acceleration(conn, "aarch64", "/k", "/i")
    assert chosen.kind == "tcg"
    assert chosen.reason == "host is i686, guest is aarch64: KVM cannot run it"


def _make_lab(conn: libvirt.virConnect, uri: str) -> None:
    for step in ("lab_pool", "overlay", "define_domain", "start_domain"):
        GIVEN[step](conn, uri)
    conn.lookupByName(DOMAIN).snapshotCreateXML(
        "<domainsnapshot><name>frozen</name></domainsnapshot>"
    )


def test_teardown_removes_everything_then_has_nothing_to_do(
    conn: libvirt.virConnect, uri: str, tmp_path: Path
) -> None:
    _make_lab(conn, uri)
    paths = LabPaths(tmp_path / "lab")
    paths.lab_dir.mkdir()
    paths.private_key.write_text("key")
    paths.state.write_text('{"schema_version": 0}')  # unreadable: teardown goes on regardless
    removed = teardown_lab(LAB, paths, uri)
    assert removed == [
        f"stopped domain {DOMAIN}",
        f"undefined domain {DOMAIN} (1 snapshots)",
        f"deleted volume {DOMAIN}.qcow2",
        f"deleted pool {POOL}",
        f"deleted {paths.lab_dir}",
    ]
    assert virt.find_domain(conn, DOMAIN) is None
    assert virt.find_pool(conn, POOL) is None
    assert not paths.lab_dir.exists()
    assert teardown_lab(LAB, paths, uri) == []


def test_teardown_of_a_half_made_lab(conn: libvirt.virConnect, uri: str, tmp_path: Path) -> None:
    GIVEN["lab_pool"](conn, uri)
    GIVEN["stop_pool"](conn, uri)
    assert teardown_lab(LAB, LabPaths(tmp_path / "lab"), uri) == [f"deleted pool {POOL}"]
    assert virt.find_pool(conn, POOL) is None


def test_teardown_refuses_a_domain_that_is_not_ours(
    conn: libvirt.virConnect, uri: str, tmp_path: Path
) -> None:
    GIVEN["foreign_domain"](conn, uri)
    with pytest.raises(RunnerError, match="not a lab domain"):
        teardown_lab(LAB, LabPaths(tmp_path / "lab"), uri)
    assert virt.find_domain(conn, DOMAIN) is not None


def test_a_lab_whose_disk_is_gone_is_removed_as_an_orphan(
    conn: libvirt.virConnect, uri: str
) -> None:
    # A removed checkout's lab: its domain defined, the overlay it boots from not in its pool.
    for step in ("lab_pool", "define_domain", "start_domain"):
        GIVEN[step](conn, uri)
    assert remove_orphaned_lab(LAB, uri) == [
        f"stopped domain {DOMAIN}",
        f"undefined domain {DOMAIN} (0 snapshots)",
        f"deleted pool {POOL}",
    ]
    assert virt.find_domain(conn, DOMAIN) is None
    assert virt.find_pool(conn, POOL) is None


@pytest.mark.parametrize(
    "given",
    [
        ("lab_pool", "overlay", "define_domain", "start_domain"),  # a whole lab
        ("lab_pool", "stop_pool"),  # a half-made one: its directory is there
        ("foreign_domain",),  # not ours at all
    ],
)
def test_a_lab_whose_files_are_there_is_no_orphan(
    conn: libvirt.virConnect, uri: str, given: tuple[str, ...]
) -> None:
    for step in given:
        GIVEN[step](conn, uri)
    assert remove_orphaned_lab(LAB, uri) == []
    assert virt.find_pool(conn, POOL) is not None or "lab_pool" not in given
    assert virt.find_domain(conn, DOMAIN) is not None or "define_domain" not in given


def test_a_boot_wait_ends_at_once_when_the_vm_does_not_run(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    lab = LabState(
        lab=LAB,
        environment_fingerprint="sha256:" + "0" * 64,
        libvirt_uri=uri,
        domain_name=DOMAIN,
        domain_uuid=lab_uuid(LAB),
        guest_arch="aarch64",
        acceleration=Acceleration(kind="tcg", reason="test"),
        pool_name=POOL,
        pool_dir="/pools/t",
        overlay_path=SPEC.disk,
        console_log=SPEC.console_log,
        ssh_port=_closed_loopback_port(),
        private_key=str(tmp_path / "key"),
        proxy_port=40080,
        image=ImageRef(store_dir="/images", input_hash="0", root_sha256="sha256:" + "0" * 64),
    )
    write_model(LabPaths.for_lab(LAB).state, lab)
    started = time.monotonic()
    with pytest.raises(GuestError, match=f"its VM {DOMAIN} is absent"):
        wait_for_guest(LAB, wait_seconds=900)
    GIVEN["define_domain"](virt.connect(uri), uri)  # defined, never started
    with pytest.raises(GuestError, match=f"its VM {DOMAIN} is shutoff"):
        wait_for_guest(LAB, wait_seconds=900)
    assert time.monotonic() - started < 5


def _closed_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
