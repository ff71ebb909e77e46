"""The disk inventory (runner.freeze.inventory) of a small root filesystem built in tmp_path:
its entries, its excludes, and dpkg's own digests of the packages' files, resolved as dpkg
resolves them (directory symlinks, diversions, path filters)."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.freeze.inventory import (
    PackageFile,
    deviations,
    inventory_of,
    package_files,
    read_through,
    resolve,
    take_inventory,
)
from runner.freeze.manifest import task_digests

EXCLUDES = ("/var/log", "/var/cache/*.lock")
OWNER = f"{os.getuid()}:{os.getgid()}"

# path -> content of every regular file of the fake disk
FILES = {
    "usr/bin/tool": b"#!/bin/sh\necho tool\n",
    "usr/bin/btool": b"btool v1\n",
    "usr/bin/su-tool": b"setuid\n",
    "usr/bin/diverted": b"the admin's own\n",
    "usr/bin/diverted.distrib": b"the package's\n",
    "usr/share/doc/pkg-a/copyright": b"GPL\n",
    "usr/local/bin/a": b"same inode\n",
    "etc/pkg.conf": b"setting = 1\n",
    "srv/tasks/t1/task.toml": b"[task]\n",
    "srv/tasks/t1/tests/test.sh": b"exit 0\n",
    "var/log/syslog": b"boot\n",
    "var/logger": b"not below /var/log\n",
    "var/cache/a.lock": b"1\n",
    "var/cache/sub/b.lock": b"2\n",
    "var/cache/keep": b"kept\n",
}


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def status(conffile_md5: str) -> str:
    return (
        "Package: pkg-a\nStatus: install ok installed\nArchitecture: all\nVersion: 1\n"
        "Conffiles:\n"
        f" /etc/pkg.conf {conffile_md5}\n"
        f" /etc/old.conf {'0' * 32} obsolete\n"
        "\n"
        "Package: pkg-b\nStatus: install ok installed\nArchitecture: arm64\nVersion: 2\n"
        "Description: a package\n with a long description\n"
        "\n"
        "Package: pkg-gone\nStatus: deinstall ok config-files\nArchitecture: all\n"
        f"Conffiles:\n /etc/gone.conf {'1' * 32}\n"
    )


@dataclass
class Disk:
    root: Path

    def path(self, name: str) -> Path:
        return self.root / name


@pytest.fixture
def disk(tmp_path: Path) -> Disk:
    root = tmp_path / "root"
    for name, data in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)
    for directory in {p for p in root.rglob("*") if p.is_dir()} | {root}:
        directory.chmod(0o755)
    (root / "usr/bin/tool").chmod(0o755)
    (root / "usr/bin/su-tool").chmod(0o4755)
    (root / "bin").symlink_to("usr/bin")
    os.link(root / "usr/local/bin/a", root / "usr/local/bin/b")
    os.link(root / "usr/bin/tool", root / "usr/local/bin/tool-link")  # a package's file's link
    (root / "run").mkdir(mode=0o755)
    os.mkfifo(root / "run/fifo", 0o600)
    (root / "run/fifo").chmod(0o600)
    os.mkdir(root / os.fsdecode(b"caf\xe9"), 0o755)
    os.chmod(root / os.fsdecode(b"caf\xe9"), 0o755)

    dpkg = root / "var/lib/dpkg"
    (dpkg / "info").mkdir(parents=True)
    (dpkg / "status").write_text(status(md5(FILES["etc/pkg.conf"])))
    (dpkg / "info/pkg-a.md5sums").write_text(
        f"{md5(FILES['usr/bin/tool'])}  usr/bin/tool\n"
        f"{md5(FILES['usr/bin/su-tool'])}  usr/bin/su-tool\n"
        f"{md5(FILES['usr/bin/diverted.distrib'])}  usr/bin/diverted\n"
        f"{'2' * 32}  usr/share/doc/pkg-a/README\n"  # path-excluded: never installed
        f"{md5(FILES['usr/share/doc/pkg-a/copyright'])}  usr/share/doc/pkg-a/copyright\n"
    )
    # Only under its name with the architecture, as dpkg names a multi-arch package's files;
    # its file is listed under /bin, which the disk links to usr/bin.
    (dpkg / "info/pkg-b:arm64.md5sums").write_text(f"{md5(FILES['usr/bin/btool'])}  bin/btool\n")
    # A local diversion (":"): the package's /usr/bin/diverted lives at .distrib.
    (dpkg / "diversions").write_text("/usr/bin/diverted\n/usr/bin/diverted.distrib\n:\n")
    config = root / "etc/dpkg/dpkg.cfg.d"
    config.mkdir(parents=True)
    (config / "excludes").write_text(
        "# no docs\npath-exclude=/usr/share/doc/*\npath-include=/usr/share/doc/*/copyright\n"
    )
    return Disk(root)


def xattr_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for name in sorted(os.listxattr(path, follow_symlinks=False)):
        value = os.getxattr(path, name, follow_symlinks=False)
        digest.update(name.encode() + b"\0" + len(value).to_bytes(8, "big") + value)
    return digest.hexdigest()


def test_entries_name_type_mode_owner_content_and_target(disk: Disk) -> None:
    entries = take_inventory(disk.root, EXCLUDES).entries
    tool = FILES["usr/bin/tool"]
    assert entries["/usr/bin/tool"] == f"file 0755 {OWNER} sha256:{sha(tool)}"
    assert (
        entries["/usr/bin/su-tool"] == f"file 4755 {OWNER} sha256:{sha(FILES['usr/bin/su-tool'])}"
    )
    assert entries["/etc/pkg.conf"] == f"file 0644 {OWNER} sha256:{sha(FILES['etc/pkg.conf'])}"
    assert entries["/usr"] == f"dir 0755 {OWNER}"
    assert entries["/bin"] == f"symlink {OWNER} -> usr/bin"
    assert entries["/run/fifo"] == f"fifo 0600 {OWNER}"
    assert entries["/caf\\xe9"] == f"dir 0755 {OWNER}"  # a name that is not UTF-8, escaped
    assert not any(path.startswith("/bin/") for path in entries)  # the symlink is not followed
    assert "/" not in entries and all(path.startswith("/") for path in entries)


def test_excludes_leave_out_a_path_what_is_below_it_and_what_a_glob_matches(disk: Disk) -> None:
    entries = take_inventory(disk.root, EXCLUDES).entries
    assert not {"/var/log", "/var/log/syslog", "/var/cache/a.lock"} & entries.keys()
    assert "/var/cache/sub/b.lock" not in entries  # a glob's * crosses /
    assert {"/var/logger", "/var/cache/keep", "/var/cache/sub", "/var"} <= entries.keys()
    everything = take_inventory(disk.root, ()).entries
    assert everything.keys() - entries.keys() == {
        "/var/log",
        "/var/log/syslog",
        "/var/cache/a.lock",
        "/var/cache/sub/b.lock",
    }


def test_an_extended_attribute_is_part_of_the_entry(disk: Disk) -> None:
    path = disk.path("usr/bin/btool")
    try:
        os.setxattr(path, "user.x", b"1")
    except OSError as error:
        pytest.skip(f"no user xattrs on {path.parent}: {error}")
    entry = take_inventory(disk.root, EXCLUDES).entries["/usr/bin/btool"]
    assert entry == f"file 0644 {OWNER} sha256:{sha(FILES['usr/bin/btool'])} xattr:" + (
        xattr_digest(path)
    )
    os.setxattr(path, "user.x", b"2")
    assert take_inventory(disk.root, EXCLUDES).entries["/usr/bin/btool"] != entry


def test_a_hard_link_is_hashed_once_and_listed_under_both_names(disk: Disk) -> None:
    read: Counter[str] = Counter()

    def counting(path: str, size: int) -> Iterator[bytes]:
        read[path] += 1
        yield from read_through(path, size)

    observed = take_inventory(disk.root, EXCLUDES, contents=counting, workers=2)
    a, b = observed.entries["/usr/local/bin/a"], observed.entries["/usr/local/bin/b"]
    assert a == b == f"file 0644 {OWNER} sha256:{sha(FILES['usr/local/bin/a'])}"
    pair = [str(disk.path("usr/local/bin/a")), str(disk.path("usr/local/bin/b"))]
    assert sum(read[path] for path in pair) == 1
    # A package's file hard-linked to a path no package owns still gets its md5, whichever of
    # the two the walk met first.
    assert observed.package_md5["/usr/bin/tool"] == md5(FILES["usr/bin/tool"])
    assert observed.entries["/usr/local/bin/tool-link"] == observed.entries["/usr/bin/tool"]


def test_package_files_resolve_symlinks_diversions_and_path_filters(disk: Disk) -> None:
    files = package_files(disk.root)
    assert files == {
        "/usr/bin/tool": PackageFile("pkg-a", md5(FILES["usr/bin/tool"])),
        "/usr/bin/su-tool": PackageFile("pkg-a", md5(FILES["usr/bin/su-tool"])),
        "/usr/bin/diverted.distrib": PackageFile("pkg-a", md5(FILES["usr/bin/diverted.distrib"])),
        "/usr/share/doc/pkg-a/copyright": PackageFile(
            "pkg-a", md5(FILES["usr/share/doc/pkg-a/copyright"])
        ),
        "/usr/bin/btool": PackageFile("pkg-b", md5(FILES["usr/bin/btool"])),
        "/etc/pkg.conf": PackageFile("pkg-a", md5(FILES["etc/pkg.conf"]), conffile=True),
    }
    # Not there: the path-excluded README, the obsolete conffile, the removed package's one.


def test_resolve_follows_the_disks_own_directory_symlinks(disk: Disk) -> None:
    assert resolve(disk.root, "/bin/btool") == "/usr/bin/btool"
    assert resolve(disk.root, "/bin") == "/bin"  # the last component is the package's own
    (disk.root / "lib").symlink_to("/usr/lib")  # absolute: inside the disk, not the host
    assert resolve(disk.root, "/lib/x/y") == "/usr/lib/x/y"
    assert resolve(disk.root, "/usr/./bin/../bin/tool") == "/usr/bin/tool"


def test_deviations_are_empty_when_every_package_file_matches(disk: Disk) -> None:
    observed = take_inventory(disk.root, EXCLUDES)
    assert observed.package_md5.keys() == observed.packages.keys()
    assert deviations(observed) == {}
    assert inventory_of(observed, EXCLUDES).deviations == {}


def test_deviations_name_the_package_and_both_md5s_of_an_edited_or_removed_file(
    disk: Disk,
) -> None:
    patched = b"btool patched\n"
    disk.path("usr/bin/btool").write_bytes(patched)
    disk.path("etc/pkg.conf").unlink()
    observed = take_inventory(disk.root, EXCLUDES)
    assert deviations(observed) == {
        "/usr/bin/btool": f"pkg-b md5 {md5(FILES['usr/bin/btool'])} {md5(patched)}",
        "/etc/pkg.conf": f"pkg-a md5 {md5(FILES['etc/pkg.conf'])} absent",
    }
    inventory = inventory_of(observed, EXCLUDES)
    assert inventory.deviations == deviations(observed)
    assert inventory.excludes == EXCLUDES and inventory.entries == observed.entries


def test_the_inventory_digest_follows_its_entries(disk: Disk) -> None:
    first = inventory_of(take_inventory(disk.root, EXCLUDES), EXCLUDES)
    again = inventory_of(take_inventory(disk.root, EXCLUDES), EXCLUDES)
    assert first.sha256 == again.sha256
    disk.path("srv/tasks/t1/task.toml").chmod(0o600)
    assert inventory_of(take_inventory(disk.root, EXCLUDES), EXCLUDES).sha256 != first.sha256


def test_task_digests_of_the_inventory(disk: Disk) -> None:
    entries = take_inventory(disk.root, EXCLUDES).entries
    listing = "".join(
        f"{name}\t{entries['/srv/tasks/t1/' + name]}\n"
        for name in sorted(["task.toml", "tests", "tests/test.sh"])
    )
    assert task_digests(entries, ("/srv/tasks",)) == {
        "/srv/tasks/t1": "sha256:" + sha(listing.encode())
    }
    disk.path("srv/tasks/t1/tests/test.sh").write_bytes(b"exit 1\n")
    changed = take_inventory(disk.root, EXCLUDES).entries
    assert task_digests(changed, ("/srv/tasks",)) != task_digests(entries, ("/srv/tasks",))
