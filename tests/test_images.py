"""images/: input hash, manifest, store, initramfs and filesystem reproducibility.

The fast tests run real tools on tiny inputs (mke2fs, debugfs, busybox-free cpio parsing, sh);
the ``vm`` test builds (or finds) the real image for locks/demo.toml.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console

from images.buildlog import BuildLog
from images.disk import make_filesystem
from images.initramfs import CpioEntry, module_load_order, newc_archive
from images.manifest import ARTIFACT_NAMES, ImageManifest
from images.progress import PackageProgress
from images.recipe import (
    ARCH_RECIPES,
    GUEST_OVERLAY_DIR,
    IMAGES_DIR,
    INITRAMFS_INIT,
    ImageInputs,
    input_hash,
    recipe_file_digests,
)
from images.store import ImageStore
from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import InputError, RunnerError
from runner.spec.lock import Guest, load_lock
from tests.support.standin_container import needs_chroot

REPO = Path(__file__).resolve().parent.parent
EPOCH = 1764374400


@pytest.fixture
def guest() -> Guest:
    return load_lock(REPO / "locks" / "demo.toml").guest


def _quiet_store(root: Path) -> ImageStore:
    return ImageStore(root, Console(file=open("/dev/null", "w")))


# --- input hash ---------------------------------------------------------------------------


def test_input_hash_ignores_package_order_and_vm_sizing(guest: Guest) -> None:
    base = input_hash(ImageInputs.from_guest(guest))
    reordered = guest.model_copy(update={"packages": tuple(reversed(guest.packages))})
    resized = guest.model_copy(update={"memory_mib": guest.memory_mib * 2, "vcpus": 1})
    assert input_hash(ImageInputs.from_guest(reordered)) == base
    assert input_hash(ImageInputs.from_guest(resized)) == base


@pytest.mark.parametrize(
    "change",
    [
        {"source_date_epoch": EPOCH + 1},
        {"suite": "forky"},
        {"mirror": "http://deb.debian.org/debian-other"},
        {"disk_gib": 13},
    ],
)
def test_input_hash_follows_every_image_input(guest: Guest, change: dict[str, object]) -> None:
    changed = guest.model_copy(update=change)
    assert input_hash(ImageInputs.from_guest(changed)) != input_hash(ImageInputs.from_guest(guest))


def test_input_hash_follows_packages(guest: Guest) -> None:
    more = guest.model_copy(update={"packages": (*guest.packages, "strace")})
    assert input_hash(ImageInputs.from_guest(more)) != input_hash(ImageInputs.from_guest(guest))


def test_x86_64_guest_has_its_own_recipe_and_hash() -> None:
    guest = load_lock(REPO / "locks" / "omp-x86_64.toml").guest
    inputs = ImageInputs.from_guest(guest)
    assert (inputs.debian_arch, inputs.arch_recipe.kernel_cmdline) == (
        "amd64", "root=LABEL=root rw console=ttyS0",
    )  # fmt: skip
    assert "virtio_pci" in inputs.arch_recipe.initramfs_modules
    as_arm = guest.model_copy(
        update={"arch": "aarch64", "packages": ("linux-image-arm64", *guest.packages[1:])}
    )
    assert input_hash(inputs) != input_hash(ImageInputs.from_guest(as_arm))


def test_guest_without_its_arch_kernel_is_an_input_error(guest: Guest) -> None:
    with pytest.raises(InputError, match=r"guest\.packages must include linux-image-amd64"):
        ImageInputs.from_guest(guest.model_copy(update={"arch": "x86_64"}))


def test_recipe_files_cover_guest_overlay_and_mode(tmp_path: Path) -> None:
    copy = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = recipe_file_digests(copy)
    assert "guest/etc/ssh/sshd_config.d/bench.conf" in before
    assert before["guest/usr/local/sbin/lab-authorized-key"].endswith(" +x")
    assert "store.py" not in before  # how an image is stored does not change the image

    (copy / "guest/etc/hostname").write_text("othervm\n")
    assert recipe_file_digests(copy) != before
    (copy / "guest/etc/hostname").write_text("benchvm\n")
    assert recipe_file_digests(copy) == before
    (copy / "guest/etc/hostname").chmod(0o755)
    assert recipe_file_digests(copy) != before


# --- manifest -----------------------------------------------------------------------------


def _manifest(**override: object) -> dict[str, object]:
    digest = sha256_digest(b"x")
    data: dict[str, object] = {
        "schema_version": 1,
        "input_hash": digest,
        "arch": "aarch64",
        "suite": "trixie",
        "mirror": "http://deb.debian.org/debian",
        "source_date_epoch": EPOCH,
        "disk_gib": 12,
        "packages": {"systemd": "257.13-1~deb13u1"},
        "initramfs_packages": {"busybox-static": "1:1.37.0-6"},
        "files": {name: digest for name in ARTIFACT_NAMES},
        "kernel_version": "6.12.117+deb13-arm64",
        "kernel_cmdline": "root=LABEL=root rw console=ttyAMA0",
        "build_seconds": 512.3,
        "tools": {
            "mmdebstrap": "1.3.5-7",
            "qemu_user_static": "1:7.2",
            "e2fsprogs": "1.47.0",
            "qemu_utils": "1:7.2",
        },
    }
    data.update(override)
    return data


def test_manifest_round_trips_through_canonical_json() -> None:
    manifest = ImageManifest.model_validate(_manifest())
    assert ImageManifest.model_validate_json(canonical_json(manifest)) == manifest


@pytest.mark.parametrize(
    "override",
    [
        {"extra": 1},
        {"input_hash": "sha256:abc"},
        {"files": {"root.img": sha256_digest(b"x")}},
        {"packages": {}},
        {"schema_version": 2},
    ],
)
def test_manifest_rejects_bad_content(override: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ImageManifest.model_validate(_manifest(**override))


# --- store --------------------------------------------------------------------------------


def _fake_entry(store: ImageStore, wanted: str) -> Path:
    """A finished entry as a build would leave it, with tiny artifacts."""
    entry = store.entry(wanted)
    entry.dir.mkdir(parents=True)
    for name in ARTIFACT_NAMES:
        entry.artifact(name).write_bytes(name.encode())
    files = {name: sha256_digest(name.encode()) for name in ARTIFACT_NAMES}
    manifest = ImageManifest.model_validate(_manifest(input_hash=wanted, files=files))
    entry.manifest.write_bytes(canonical_json(manifest))
    return entry.dir


def test_find_verifies_every_artifact(tmp_path: Path) -> None:
    store = _quiet_store(tmp_path)
    wanted = sha256_digest(b"inputs")
    assert store.find(wanted) is None
    entry = _fake_entry(store, wanted)
    found = store.find(wanted)
    assert found is not None and found.input_hash == wanted
    (entry / "initrd.img").write_bytes(b"tampered")
    assert store.find(wanted) is None


def test_find_rejects_a_manifest_for_other_inputs(tmp_path: Path) -> None:
    store = _quiet_store(tmp_path)
    wanted = sha256_digest(b"inputs")
    entry = _fake_entry(store, wanted)
    other = json.loads((entry / "manifest.json").read_text())
    other["input_hash"] = sha256_digest(b"other")
    (entry / "manifest.json").write_text(json.dumps(other))
    assert store.find(wanted) is None


def test_build_returns_a_verified_entry_without_building(
    tmp_path: Path, guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_build(*_: object) -> None:
        raise AssertionError("a cache hit must not build")

    monkeypatch.setattr("images.store.build_image", must_not_build)
    store = _quiet_store(tmp_path)
    wanted = input_hash(ImageInputs.from_guest(guest))
    _fake_entry(store, wanted)
    assert store.build(guest).input_hash == wanted


def test_failed_build_leaves_no_entry_and_keeps_the_log(
    tmp_path: Path, guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_build(*_: object) -> None:
        raise RunnerError("images: mmdebstrap failed with exit code 1")

    monkeypatch.setattr("images.store.build_image", failing_build)
    store = _quiet_store(tmp_path)
    wanted = input_hash(ImageInputs.from_guest(guest))
    entry = _fake_entry(store, wanted)
    (entry / "vmlinuz").write_bytes(b"corrupt")  # a corrupt entry is rebuilt, not returned
    with pytest.raises(RunnerError, match=r"exit code 1 \(log: .*\.failed\.log\)"):
        store.build(guest)
    assert not entry.exists()
    assert store.paths.failed_log(wanted).is_file()
    assert not list(store.paths.root.glob(".staging-*"))


# --- build progress -----------------------------------------------------------------------

# (seconds since start, an mmdebstrap --verbose line or None for a second of silence), shaped
# like a real build.log's.
_MMDEBSTRAP_OUTPUT: list[tuple[float, str | None]] = [
    (2.6, "I: downloading packages with apt..."),
    (3.2, "0 upgraded, 3 newly installed, 0 to remove and 0 not upgraded."),
    (9.4, "I: installing essential packages..."),
    (9.7, "Selecting previously unselected package gcc-14-base:arm64."),
    (9.7, "Preparing to unpack .../gcc-14-base_14.2.0-19_arm64.deb ..."),
    (9.7, "Unpacking gcc-14-base:arm64 (14.2.0-19) ..."),
    (15.0, "Unpacking libc6:arm64 (2.41-12+deb13u5) ..."),
    (16.0, "Unpacking mawk (1.3.4.20250131-1) ..."),
    (16.1, "Setting up gcc-14-base:arm64 (14.2.0-19) ..."),
    (20.0, "Setting up libc6:arm64 (2.41-12+deb13u5) ..."),
    (21.0, "Setting up mawk (1.3.4.20250131-1) ..."),
    (21.1, "update-alternatives: using /usr/bin/mawk to provide /usr/bin/awk (awk) in auto mode"),
    (23.0, "Processing triggers for libc-bin (2.41-12+deb13u5) ..."),
    (25.0, None),
    (27.0, None),
    (28.0, None),
    (30.0, "I: running --essential-hook in shell: sh -c 'chroot ...'"),
    (36.0, None),
    (37.0, "I: installing remaining packages inside the chroot..."),
    (37.5, "0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded."),
    (39.0, "Unpacking login.defs (1:4.17.4-2) ..."),
    (43.0, "Unpacking sudo (1.9.16p2-3+deb13u5) ..."),
    (43.5, "I: /vmlinuz is now a symlink to boot/vmlinuz-6.12.117+deb13-arm64"),  # a postinst's
    (44.0, "Setting up login.defs (1:4.17.4-2) ..."),
    (47.0, None),
    (49.0, None),
    (50.0, "Setting up sudo (1.9.16p2-3+deb13u5) ..."),
    (52.0, "I: running --customize-hook directly: .../eatmydata/customize.sh ..."),
    (53.0, "Setting up nothing (1) ..."),
    (60.0, None),
]


def test_package_phases_show_a_count_every_few_seconds_even_in_silence() -> None:
    now = [0.0]
    progress = PackageProgress(interval=5.0, clock=lambda: now[0])
    shown: list[str] = []
    for now[0], line in _MMDEBSTRAP_OUTPUT:
        shown += [f"{now[0]:.0f} {text}" for text in progress.console_lines(line)]
    assert shown == [
        "3 I: downloading packages with apt...",
        "9 I: installing essential packages...",
        "15 packages: 2/3 unpacked, 0/3 set up; unpacking libc6:arm64",
        "20 packages: 3/3 unpacked, 2/3 set up; setting up libc6:arm64",  # 5 s later
        "21 packages: 3/3 unpacked, 3/3 set up; setting up mawk",  # all set up: at once
        "27 packages: 3/3 unpacked, 3/3 set up; processing triggers for libc-bin",  # silent
        "30 I: running --essential-hook in shell: sh -c 'chroot ...'",
        "37 I: installing remaining packages inside the chroot...",
        "43 packages: 2/2 unpacked, 0/2 set up; unpacking sudo",
        "44 I: /vmlinuz is now a symlink to boot/vmlinuz-6.12.117+deb13-arm64",
        "49 packages: 2/2 unpacked, 1/2 set up; setting up login.defs",
        "50 packages: 2/2 unpacked, 2/2 set up; setting up sudo",
        "52 I: running --customize-hook directly: .../eatmydata/customize.sh ...",
    ]


def test_build_log_tells_the_console_filter_of_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("images.buildlog.SILENCE_SECONDS", 0.1)
    heard: list[str | None] = []

    def show(line: str | None) -> list[str]:
        heard.append(line)
        return []

    log = BuildLog(tmp_path / "build.log", Console(file=open("/dev/null", "w")))  # noqa: SIM115
    assert log.run(["sh", "-c", "echo one; sleep 1; echo two"], show=show) == ["one", "two"]
    log.close()
    assert heard[0] == "one" and heard[-1] == "two"
    assert heard[1:-1] and set(heard[1:-1]) == {None}


def test_emulated_cpu_is_one_qemu_user_offers() -> None:
    cpu = ARCH_RECIPES["aarch64"].emulated_cpu
    # "-cpu help" lists the models and exits 1.
    listed = subprocess.run(
        ["qemu-aarch64-static", "-cpu", "help"], capture_output=True, text=True
    ).stdout.split()
    assert cpu in listed


# --- initramfs ----------------------------------------------------------------------------


def test_module_load_order_puts_dependencies_first(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/mbcache.ko.xz"
        " kernel/fs/jbd2/jbd2.ko.xz\n"
        "kernel/fs/jbd2/jbd2.ko.xz:\nkernel/fs/mbcache.ko.xz:\nkernel/lib/crc16.ko.xz:\n"
        "kernel/drivers/block/virtio_blk.ko.xz:\nkernel/crypto/crc32c_generic.ko.xz:\n"
    )
    (tmp_path / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n")
    order = module_load_order(tmp_path, ("crc32c_generic", "virtio_pci", "ext4"))
    assert order == [
        "kernel/crypto/crc32c_generic.ko.xz",
        "kernel/fs/jbd2/jbd2.ko.xz",
        "kernel/fs/mbcache.ko.xz",
        "kernel/lib/crc16.ko.xz",
        "kernel/fs/ext4/ext4.ko.xz",
    ]
    with pytest.raises(RunnerError, match="'nvme'"):
        module_load_order(tmp_path, ("nvme",))


def test_newc_archive_is_what_cpio_reads(tmp_path: Path) -> None:
    if shutil.which("cpio") is None:
        pytest.skip("cpio is not installed")
    entries = [
        CpioEntry("bin", stat.S_IFDIR | 0o755),
        CpioEntry("bin/tool", stat.S_IFREG | 0o755, b"#!/bin/sh\necho hi\n"),
        CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
    ]
    archive = newc_archive(entries, EPOCH)
    assert archive == newc_archive(entries, EPOCH)
    listing = subprocess.run(
        ["cpio", "-itv", "--quiet"], input=archive, capture_output=True, check=True
    ).stdout.decode()
    assert [line.split()[-1] for line in listing.splitlines()] == [
        "bin",
        "bin/tool",
        "dev/console",
    ]
    assert listing.splitlines()[2].startswith("crw-------")


def test_init_scripts_parse() -> None:
    for script in (INITRAMFS_INIT, KEY_SCRIPT, HOST_KEY_SCRIPT):
        subprocess.run(["sh", "-n", str(script)], check=True)


# --- the initramfs's init, run in a sandbox ------------------------------------------------
# The init runs as PID 1 of the initramfs: here it runs under chroot in a directory laid out as
# the initramfs is (etc/modules-order, lib/modules/, an empty dev, proc and sys), the host's /usr
# bound read-only for a shell, and every command it calls stubbed in /bin: each stub appends
# its name and arguments to /calls (mkdir and cat do their work too; findfs answers only on its
# second call, as a disk that appears late). /proc/cmdline is a plain file.

_STUBS = {
    "busybox": "",
    "mount": "",
    "umount": "",
    "insmod": 'case "$1" in */broken.ko) exit 1 ;; esac',
    "findfs": "test -e /findfs-asked || { : > /findfs-asked; exit 1; }; echo /dev/vda",
    "sleep": "",
    "mkdir": '/usr/bin/mkdir "$@"',
    "cat": '/usr/bin/cat "$@"',
    "switch_root": "",
    "sh": "exit 7",  # panic's shell: the test sees it was reached
}


def _run_init(root: Path, cmdline: str, modules: tuple[str, ...]) -> tuple[int, str, list[str]]:
    for name in ("bin", "dev", "proc", "sys", "etc", "lib/modules", "usr"):
        (root / name).mkdir(parents=True)
    for name in ("lib64",):
        if (Path("/usr") / name).exists():
            (root / name).symlink_to(f"usr/{name}")
    for entry in Path("/usr/lib").iterdir():  # the dynamic loader and libc, where /lib has them
        if entry.name.startswith("ld-linux") or entry.name.endswith("-linux-gnu"):
            (root / "lib" / entry.name).symlink_to(f"/usr/lib/{entry.name}")
    for name, body in _STUBS.items():
        stub = root / "bin" / name
        stub.write_text(f'#!/usr/bin/sh\necho "{name} $*" >> /calls\n{body}\n')
        stub.chmod(0o755)
    (root / "proc/cmdline").write_text(cmdline + "\n")
    (root / "etc/modules-order").write_text("".join(f"{m}\n" for m in modules))
    for module in modules:
        (root / "lib/modules" / f"{module}.ko").write_bytes(b"\x7fELF")
    shutil.copy(INITRAMFS_INIT, root / "init")
    enter = (
        'mount --bind /usr "$1/usr" && mount -o remount,bind,ro "$1/usr" && '
        'exec chroot "$1" /usr/bin/env -i /usr/bin/sh /init'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", enter, "sh", root],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = (root / "calls").read_text().splitlines() if (root / "calls").exists() else []
    return done.returncode, done.stderr, calls


@needs_chroot
def test_init_loads_the_modules_waits_for_the_root_and_switches_to_it(tmp_path: Path) -> None:
    code, stderr, calls = _run_init(
        tmp_path, "console=ttyAMA0 root=LABEL=root rw init=/sbin/bench-init quiet", ("a", "b")
    )
    assert (code, stderr) == (0, "")
    assert calls == [
        "busybox --install -s /bin",
        "mount -t devtmpfs devtmpfs /dev",
        "mount -t proc proc /proc",
        "mount -t sysfs sysfs /sys",
        "insmod /lib/modules/a.ko",
        "insmod /lib/modules/b.ko",
        "cat /proc/cmdline",
        "findfs LABEL=root",  # not there yet
        "sleep 0.1",
        "findfs LABEL=root",
        "mkdir -p /root",
        "mount -t ext4 -o rw /dev/vda /root",
        "umount /sys",
        "umount /proc",
        "mount --move /dev /root/dev",
        "switch_root /root /sbin/bench-init",
    ]
    assert (tmp_path / "root").is_dir()


@needs_chroot
def test_init_mounts_read_only_and_hands_to_sbin_init_by_default(tmp_path: Path) -> None:
    code, _stderr, calls = _run_init(tmp_path, "root=UUID=1234 ro", ())
    assert code == 0
    assert "mount -t ext4 -o ro /dev/vda /root" in calls
    assert calls[-1] == "switch_root /root /sbin/init"
    assert not any(call.startswith("insmod") for call in calls)


@needs_chroot
@pytest.mark.parametrize(
    ("cmdline", "modules", "problem"),
    [
        ("rw quiet", (), "initramfs: no root= on the kernel command line"),
        ("root=LABEL=root", ("a", "broken", "c"), "initramfs: cannot load broken"),
    ],
    ids=["no-root", "module-fails"],
)
def test_init_panics_to_a_shell_and_never_switches(
    tmp_path: Path, cmdline: str, modules: tuple[str, ...], problem: str
) -> None:
    code, stderr, calls = _run_init(tmp_path, cmdline, modules)
    assert (code, stderr.strip()) == (7, problem)
    assert calls[-1] == "sh "
    assert not any(
        call.startswith(("switch_root", "mount -t ext4", "insmod /lib/modules/c")) for call in calls
    )


# --- boot-time key ------------------------------------------------------------------------

KEY_SCRIPT = GUEST_OVERLAY_DIR / "usr/local/sbin/lab-authorized-key"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly bench@host"


def _run_key_script(tmp_path: Path, cmdline: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "cmdline").write_text(cmdline + "\n")
    env = {"LAB_CMDLINE": str(tmp_path / "cmdline"), "LAB_SSH_DIR": str(tmp_path / "ssh")}
    return subprocess.run(["sh", str(KEY_SCRIPT)], env=env, capture_output=True, text=True)


def test_key_from_kernel_cmdline_becomes_authorized_keys(tmp_path: Path) -> None:
    encoded = base64.b64encode(PUBLIC_KEY.encode()).decode()
    result = _run_key_script(tmp_path, f"root=LABEL=root rw lab.authorized_key={encoded} quiet")
    assert result.returncode == 0, result.stderr
    keys = tmp_path / "ssh" / "authorized_keys"
    assert keys.read_text() == PUBLIC_KEY + "\n"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ssh").stat().st_mode) == 0o700


def test_key_script_refuses_what_is_not_a_public_key(tmp_path: Path) -> None:
    encoded = base64.b64encode(b"rm -rf /").decode()
    result = _run_key_script(tmp_path, f"lab.authorized_key={encoded}")
    assert result.returncode == 1
    assert not (tmp_path / "ssh" / "authorized_keys").exists()


def test_no_key_parameter_changes_nothing(tmp_path: Path) -> None:
    assert _run_key_script(tmp_path, "root=LABEL=root rw").returncode == 0
    assert not (tmp_path / "ssh").exists()


HOST_KEY_SCRIPT = GUEST_OVERLAY_DIR / "usr/local/sbin/lab-host-key"


def test_host_key_script_prints_the_public_key_as_one_marked_console_line(tmp_path: Path) -> None:
    (tmp_path / "ssh_host_ed25519_key.pub").write_text(
        PUBLIC_KEY.replace("bench@host", "root@benchvm") + "\n"
    )
    env = {
        "LAB_HOST_KEY": str(tmp_path / "ssh_host_ed25519_key.pub"),
        "LAB_CONSOLE": str(tmp_path / "console"),
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["sh", str(HOST_KEY_SCRIPT)], env=env, check=True)
    key_type, key_base64, _comment = PUBLIC_KEY.split()
    assert (tmp_path / "console").read_text() == f"lab.host_key={key_type} {key_base64}\n"


# --- filesystem reproducibility -------------------------------------------------------------


def _tiny_tree(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("benchvm\n")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "tool").write_bytes(b"\x7fELF" + bytes(5000))
    (root / "usr" / "bin" / "alias").symlink_to("tool")


def _filesystem_digest(tmp_path: Path, name: str) -> str:
    tree = tmp_path / name
    _tiny_tree(tree)
    (tree / "etc" / "hostname").read_text()  # moves the atime of one build only
    raw = tmp_path / f"{name}.raw"
    log = BuildLog(tmp_path / f"{name}.log", Console(file=open("/dev/null", "w")))  # noqa: SIM115
    make_filesystem(
        tree, raw, size_gib=1, label="root", input_hash=sha256_digest(b"i"), epoch=EPOCH, log=log
    )
    log.close()
    return hashlib.sha256(raw.read_bytes()).hexdigest()


def test_filesystem_bytes_do_not_depend_on_when_or_where_it_was_built(tmp_path: Path) -> None:
    first = _filesystem_digest(tmp_path, "a")
    time.sleep(1.1)  # every ctime of the second tree is a later second
    assert _filesystem_digest(tmp_path, "b") == first


# --- the real image -------------------------------------------------------------------------


@pytest.mark.vm
def test_demo_image_is_built_or_found_and_verified(guest: Guest) -> None:
    store = ImageStore()
    manifest = store.build(guest)
    entry = store.entry(manifest.input_hash)
    for name in ARTIFACT_NAMES:
        path = entry.artifact(name)
        assert (
            "sha256:" + hashlib.file_digest(path.open("rb"), "sha256").hexdigest()
            == (manifest.files[name])
        )
    info = json.loads(
        subprocess.run(
            ["qemu-img", "info", "--output=json", str(entry.root_qcow2)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert info["format"] == "qcow2"
    assert info["virtual-size"] == guest.disk_gib * 1024**3
    assert {"openssh-server", "systemd", "linux-image-arm64", "podman"} <= set(manifest.packages)


def test_cli_reports_a_bad_lock_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            "python",
            "-m",
            "images",
            "build",
            str(tmp_path / "missing.toml"),
            "--store",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path}/missing.toml: no such lock file"
    ]
    assert result.stdout == ""
