"""Stage 2: make the guest tree the VM the other rooms rely on (natively, on the host).

The contract: hostname benchvm; fstab by LABEL=root; DHCP by systemd-networkd with nothing
waiting for network-online; sshd with key-only root login, no DNS lookups and no host keys in
the image (sshd-keygen.service makes one at boot, and lab-host-key.service prints its public half
to the serial console for the host to pin); root's key from the kernel command line
(lab.authorized_key=, see guest/usr/local/sbin/lab-authorized-key); empty machine-id; no apt
sources and no timers that would run during a benchmark.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from images.buildlog import BuildLog
from images.recipe import GUEST_OVERLAY_DIR, Recipe

DPKG_STATUS = Path("var/lib/dpkg/status")
APT_PARTIAL_DIRS = ("var/cache/apt/archives/partial", "var/lib/apt/lists/partial")
TIMER_UNIT_DIRS = ("usr/lib/systemd/system", "lib/systemd/system", "etc/systemd/system")


def copy_overlay(rootfs: Path, overlay: Path = GUEST_OVERLAY_DIR) -> list[str]:
    """Copy every overlay file into the tree (replacing files or symlinks); mode 755 or 644."""
    copied: list[str] = []
    for source in sorted(p for p in overlay.rglob("*") if p.is_file()):
        relative = source.relative_to(overlay)
        target = rootfs / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        shutil.copyfile(source, target)
        target.chmod(0o755 if source.stat().st_mode & 0o111 else 0o644)
        copied.append(relative.as_posix())
    return copied


def remove_host_keys(rootfs: Path) -> list[str]:
    """openssh-server's postinst made host keys; an image must not carry any."""
    removed = sorted(p.name for p in (rootfs / "etc/ssh").glob("ssh_host_*"))
    for name in removed:
        (rootfs / "etc/ssh" / name).unlink()
    return removed


def installed_packages(rootfs: Path) -> dict[str, str]:
    """``name -> version`` of every package dpkg says is installed in the tree."""
    packages: dict[str, str] = {}
    for stanza in (rootfs / DPKG_STATUS).read_text().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status") == "install ok installed":
            packages[fields["Package"]] = fields["Version"]
    return dict(sorted(packages.items()))


def configure(rootfs: Path, recipe: Recipe, log: BuildLog) -> None:
    log.stage("configure", "hostname, fstab, sshd, networkd, boot-time key unit")
    for path in copy_overlay(rootfs):
        log.note(f"overlay: /{path}")
    for name in remove_host_keys(rootfs):
        log.note(f"removed host key /etc/ssh/{name}")
    # Two builds from the same inputs differed only here: apt hands these to _apt on some runs
    # and not others. root owns them in the image; apt re-chowns them when it next downloads.
    for partial in APT_PARTIAL_DIRS:
        os.chown(rootfs / partial, 0, 0)
    (rootfs / "etc/machine-id").write_text("")
    (rootfs / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    # systemctl only writes symlinks here; it runs emulated but takes a second.
    log.run(["chroot", str(rootfs), "systemctl", "enable", *recipe.units_enabled])
    log.run(["chroot", str(rootfs), "systemctl", "mask", *recipe.units_masked])
    # No timer may wake up during a benchmark: every timer unit the packages ship, not a list of
    # the ones we knew (systemd-tmpfiles-clean.timer, 15 min after boot, fired inside an audit;
    # a reset rewinds the guest's clock to the freeze, so it would fire in every cell).
    timers = timer_units(rootfs)
    if timers:
        log.run(["chroot", str(rootfs), "systemctl", "mask", *timers])


def timer_units(rootfs: Path) -> list[str]:
    """Every timer unit of the image, by name, wherever systemd reads units from."""
    return sorted(
        {
            path.name
            for directory in TIMER_UNIT_DIRS
            for path in (rootfs / directory).glob("*.timer")
        }
    )
