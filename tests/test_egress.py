"""The guest's egress firewall (runner/lab/egress.py) without a guest: its ruleset, the parsing
of what nft lists, the ledger line a cell gets from it (a FakeTransport for the guest), the
report's section, the guest deploy's steps that install it (recorded, not run), and the freeze's
record of its loaded table.

The listings in tests/fixtures/egress/ are nft 1.1.3's own output (Debian trixie's nftables, the
version in the guest's image) with this ruleset loaded, captured by capture.sh there in network
namespaces standing for the guest, a task container on a Podman-like bridge and QEMU's network:
one right after loading (nothing refused), one after refused attempts from both.
"""

from __future__ import annotations

import json
import shutil

import pytest

from runner.core.roots import REPO_ROOT
from runner.freeze.live import LIVE_PROBES
from runner.freeze.manifest import default_scope
from runner.lab import egress
from runner.lab.egress import EgressReadError, RefusedEgress, parse_refused
from runner.lab.layout import GUEST_MIRROR_ADDRESS, GUEST_PROXY_ADDRESS
from runner.lab.transport import ExecResult
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import Cell, build_schedule
from runner.report.egress_summary import CellEgress, egress_section, refused_egress, summed
from runner.report.markdown import markdown
from runner.spec.lock import Lock, load_lock
from runner.verify.playbook import build_playbook
from tests.support.cell_fixtures import runner_for
from tests.support.fake_transport import (
    EGRESS_LISTINGS,
    NOTHING_REFUSED,
    FakeTransport,
    Handler,
    answer,
    trial_tree,
)
from tests.support.freeze_factory import manifest_of
from tests.support.playbook_commands import commands_of
from tests.support.recorded_provisioning import example_plan, record_provisioning

REFUSED = (EGRESS_LISTINGS / "nft-1.1.3-refused.json").read_text()
# What capture.sh did: from the container two TCP connects to 192.0.2.1:443, a lookup through
# the containers' resolver (A and AAAA, two tries each), one ICMP echo; from the guest the same
# connects and a lookup through its loopback resolver (one packet: refused in the sender's own
# send, the lookup gives up at once).
CAPTURED = (
    RefusedEgress(source="container", proto="icmp", address="192.0.2.7", port=None, packets=1),
    RefusedEgress(source="container", proto="tcp", address="192.0.2.1", port=443, packets=2),
    RefusedEgress(source="container", proto="udp", address="192.0.2.53", port=53, packets=4),
    RefusedEgress(source="guest", proto="tcp", address="192.0.2.1", port=443, packets=2),
    RefusedEgress(source="guest", proto="udp", address="127.0.0.53", port=53, packets=1),
)


def test_the_captured_listing_names_each_refused_destination_with_its_count() -> None:
    refused = parse_refused(REFUSED)
    assert refused == CAPTURED
    assert [entry.label for entry in refused] == [
        "icmp 192.0.2.7 x1 (container)",
        "tcp 192.0.2.1:443 x2 (container)",
        "udp 192.0.2.53:53 x4 (container)",
        "tcp 192.0.2.1:443 x2 (guest)",
        "udp 127.0.0.53:53 x1 (guest)",
    ]
    # The total counter beside the sets agrees: nothing refused escaped the sets.
    counter = next(item["counter"] for item in json.loads(REFUSED)["nftables"] if "counter" in item)
    assert counter["packets"] == sum(entry.packets for entry in refused)


def test_a_listing_with_nothing_refused_is_an_empty_record() -> None:
    assert parse_refused(NOTHING_REFUSED) == ()


def test_an_ipv6_destination_is_bracketed_in_its_label() -> None:
    entry = RefusedEgress(source="guest", proto="tcp", address="2001:db8::1", port=443, packets=1)
    assert entry.label == "tcp [2001:db8::1]:443 x1 (guest)"


@pytest.mark.parametrize(
    ("listing", "problem"),
    [
        ("nft: command not found", "is not nft JSON"),
        ('{"nftables": [{"metainfo": {"version": "1.1.3"}}]}', "has no set guest_v4"),
        (
            REFUSED.replace('"127.0.0.53"', '"not an address"'),
            "unreadable element of the firewall's sets",
        ),
    ],
    ids=["not-json", "no-table", "bad-element"],
)
def test_a_listing_that_is_not_the_firewalls_is_one_line(listing: str, problem: str) -> None:
    with pytest.raises(EgressReadError) as raised:
        parse_refused(listing)
    assert problem in str(raised.value) and "\n" not in str(raised.value)


def test_the_ruleset_lets_out_only_the_proxy_and_the_mirror_and_keeps_podmans_tables() -> None:
    rules = egress.ruleset()
    assert GUEST_MIRROR_ADDRESS == "10.0.2.101:80"
    accepted = {line.strip() for line in rules.splitlines() if line.strip().startswith("ip daddr")}
    assert accepted == {
        "ip daddr 10.0.2.100 tcp dport 8080 accept",
        "ip daddr 10.0.2.101 tcp dport 80 accept",
    }
    assert GUEST_PROXY_ADDRESS == "10.0.2.100:8080"
    assert "flush ruleset" not in rules  # it would remove netavark's table too
    assert f"delete table inet {egress.TABLE}" in rules
    # Both hooks end by refusing whatever was not let through.
    assert rules.count("goto refused_guest") == 2 and rules.count("goto refused_container") == 1
    assert f"nameserver {egress.GUEST_RESOLVER}" in egress.RESOLV_CONF
    assert egress.CONTAINER_RESOLVER in egress.CONTAINERS_DNS_CONF


# --- the ledger line of a cell ------------------------------------------------------------------


@pytest.fixture(scope="module")
def lock() -> Lock:
    return load_lock(REPO_ROOT / "locks" / "demo.toml")


@pytest.fixture
def cell(lock: Lock) -> Cell:
    return build_schedule(lock).cells[0]


def guest_reporting(listing: ExecResult | str) -> Handler:
    """A guest whose Harbor fails the task (reward 0) and whose firewall lists ``listing``."""

    def handler(command: str) -> ExecResult:
        if command == egress.READ_COMMAND:
            return listing if isinstance(listing, ExecResult) else answer(command, stdout=listing)
        return answer(command)

    return handler


def run_cell(lock, cell, paths: RunPaths, proxy, tmp_path, handler: Handler) -> LedgerLine:
    guest = FakeTransport(handler, trial_tree(tmp_path / "t", "fail"))
    line = runner_for(lock, paths, proxy, guest).run(cell, Ledger(paths))
    assert guest.commands.index(egress.READ_COMMAND) > next(
        number for number, command in enumerate(guest.commands) if "trial start" in command
    )
    return line


def test_the_ledger_line_carries_what_the_guest_refused_and_the_verdict_stays(
    lock, cell, paths, proxy, tmp_path
):
    line = run_cell(lock, cell, paths, proxy, tmp_path, guest_reporting(REFUSED))
    assert line.egress_refused == CAPTURED
    assert (line.outcome, line.reason) == ("fail", "reward 0")
    assert "egress" in line.phase_seconds
    (recorded,) = Ledger(paths).lines()
    assert recorded.egress_refused == CAPTURED
    written = json.loads(paths.ledger.read_text())
    assert written["egress_refused"][0] == {
        "source": "container",
        "proto": "icmp",
        "address": "192.0.2.7",
        "port": None,
        "packets": 1,
    }


def test_nothing_refused_is_an_empty_list_on_the_ledger_line(lock, cell, paths, proxy, tmp_path):
    line = run_cell(lock, cell, paths, proxy, tmp_path, guest_reporting(NOTHING_REFUSED))
    assert line.egress_refused == ()
    assert json.loads(paths.ledger.read_text())["egress_refused"] == []


def test_the_harbor_command_empties_the_record_first(lock, cell, paths, proxy, tmp_path):
    guest = FakeTransport(guest_reporting(NOTHING_REFUSED), trial_tree(tmp_path / "t", "fail"))
    runner_for(lock, paths, proxy, guest).run(cell, Ledger(paths))
    (harbor,) = [command for command in guest.commands if "trial start" in command]
    assert harbor.startswith(egress.RESET_COMMAND + "; ")


def test_a_firewall_that_cannot_be_read_is_not_recorded_and_says_why(
    lock, cell, paths, proxy, tmp_path
):
    missing = ExecResult(
        command=egress.READ_COMMAND,
        exit_code=1,
        stdout="",
        # nft 1.1.3's own words for a table that is not there
        stderr="Error: No such file or directory\nlist table inet bench_egress\n"
        "                ^^^^^^^^^^^^\n",
        seconds=0.1,
    )
    line = run_cell(lock, cell, paths, proxy, tmp_path, guest_reporting(missing))
    assert line.egress_refused is None
    assert line.outcome == "fail"
    assert line.reason == (
        "reward 0; egress not recorded: nft exited 1: Error: No such file or directory"
    )
    assert "egress_refused" not in json.loads(paths.ledger.read_text())


def test_a_ledger_line_from_before_the_field_keeps_its_bytes(lock, cell, paths, proxy, tmp_path):
    run_cell(lock, cell, paths, proxy, tmp_path, guest_reporting(NOTHING_REFUSED))
    older = json.loads(paths.ledger.read_text())
    del older["egress_refused"]
    raw = json.dumps(older, separators=(",", ":"))
    line = LedgerLine.model_validate_json(raw)
    assert line.egress_refused is None
    assert line.model_dump_json(by_alias=True) == raw


# --- the report -----------------------------------------------------------------------------------


def test_the_report_shows_each_harness_refused_egress_and_the_cells_that_had_any(
    lock, cell, paths, proxy, tmp_path
):
    run_cell(lock, cell, paths, proxy, tmp_path, guest_reporting(REFUSED))
    shutil.copyfile(REPO_ROOT / "locks" / "demo.toml", paths.lock)
    found = refused_egress(paths)
    label = next(h.label for h in lock.harnesses if h.id == cell.harness)
    assert found == {label: (CellEgress(cell.id, CAPTURED),)}
    quiet = CellEgress("quiet-cell", ())
    unread = CellEgress("unread-cell", None)
    text = markdown(egress_section({**found, "Other": (quiet, unread)}))
    assert "## Refused egress (the guest's firewall, per cell)" in text
    assert f"| {label} | 1 | 1 | 1 | icmp 192.0.2.7 x1 (container), " in text
    assert "| Other | 2 | 1 | 0 | none |" in text
    assert f"- `{cell.id}`: icmp 192.0.2.7 x1 (container), tcp 192.0.2.1:443 x2" in text
    assert "quiet-cell" not in text and "unread-cell" not in text


def test_refused_egress_is_summed_over_a_harness_cells() -> None:
    one = (CAPTURED[1],)
    assert summed([one, one, ()]) == (CAPTURED[1].model_copy(update={"packets": 4}),)


def test_a_run_without_any_egress_record_has_no_section() -> None:
    assert egress_section({"Bare Pi": (CellEgress("old-line", None),)}) == []


# --- the guest deploy ---------------------------------------------------------------------------


def test_the_deploy_loads_the_firewall_before_podman_and_never_restarts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = record_provisioning(monkeypatch, example_plan())
    names = [name for name, _ in calls]
    puts = {kwargs["dest"]: (number, kwargs) for number, (name, kwargs) in enumerate(calls)
            if name == "files.put"}  # fmt: skip
    number, put = puts[egress.RULESET_PATH]
    assert put["src"].getvalue() == egress.ruleset()
    assert names.index("guest.debs_installed") < number  # nft comes with the debs
    units = [kwargs for name, kwargs in calls if kwargs.get("service") == "nftables.service"]
    assert (units[0]["running"], units[0]["enabled"]) == (True, True)
    assert units[1]["reloaded"] is True and "restarted" not in units[1]
    assert puts["/etc/resolv.conf"][1]["src"].getvalue() == egress.RESOLV_CONF
    podman_number, podman = puts["/etc/containers/containers.conf.d/50-bench.conf"]
    assert podman["src"].getvalue().startswith(egress.CONTAINERS_DNS_CONF)
    # the containers' base hosts file, which containers.conf names, maps the Debian mirror's
    # name (and nothing else) to the lab's mirror
    hosts_number, hosts = puts[egress.CONTAINER_HOSTS_PATH]
    assert f'base_hosts_file = "{egress.CONTAINER_HOSTS_PATH}"' in podman["src"].getvalue()
    mapped = [line.split() for line in hosts["src"].getvalue().splitlines()[1:]]
    assert mapped[2:] == [["10.0.2.101", "deb.debian.org"]] and hosts_number < podman_number
    podman_unit = names.index("systemd.service", podman_number)
    assert number < podman_number < podman_unit  # the firewall is up before any container runs


# --- the freeze and its audit -------------------------------------------------------------------


def test_the_freeze_records_the_firewalls_table_and_the_audit_expects_it() -> None:
    scope = default_scope()
    assert scope.nft_tables == (f"inet {egress.TABLE}",)
    assert "ruleset" in {probe.category for probe in LIVE_PROBES}  # the whole ruleset too
    collected = {"kernel": "6.12", "packages": {}, "images": [], "listening": []}
    firewall = {f"inet {egress.TABLE}": "sha256:" + "e" * 64}
    manifest = manifest_of(
        {"nft_tables": list(scope.nft_tables)}, {**collected, "nft_tables": firewall}
    )
    assert manifest.state.nft_tables == firewall
    [play] = build_playbook(manifest)
    assert play["vars"]["expected"]["nft"] == firewall
    assert f"nft -s -t list table inet {egress.TABLE} " in commands_of(play)["nft"]
