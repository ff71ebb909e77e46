#!/usr/bin/env bash
# Installs and starts everything the lab needs on a Debian host, as root. Idempotent.
# Used by the README's first command and by .ci/run, so a fresh machine and CI agree.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt_packages=(
  libvirt-daemon-system libvirt-clients libvirt-dev pkg-config
  qemu-system-arm qemu-system-x86 qemu-efi-aarch64 qemu-utils
  mmdebstrap arch-test qemu-user-static binfmt-support e2fsprogs
  openssh-client git sqlite3 tini socat cpio
  # the credential scan's tests build their evasive files with a guest's own tools (hexdump)
  xxd bsdextrautils zip
  ripgrep fd-find
  skopeo docker-registry strace
  chromium-headless-shell
  python3-venv python3-dev build-essential
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Under the project's apt lock (deploy/operations/host.py, APT_LOCK): two runs at once (a test
# run's labs, another checkout's setup) wait for each other instead of failing on apt's own locks.
apt_locked=(flock -w 900 /run/lock/frozen-bench-apt.lock)
if ((${#missing[@]})); then
  mkdir -p /run/lock
  "${apt_locked[@]}" apt-get update -qq
  "${apt_locked[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# docker-registry is for the tests, which run their own on 127.0.0.1 only; where an init system
# started the package's registry (it listens on :5000 on every interface), it is stopped for good.
if [ -d /run/systemd/system ]; then
  systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
fi

# arm64 binaries under emulation (mmdebstrap's second stage runs them).
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true

# QEMU runs a relay (socat) for each guest connection to the host proxy; libvirt's default
# seccomp sandbox forbids QEMU to spawn it (see deploy/domain_xml.py). A running libvirtd is
# restarted once to take the change.
qemu_conf=/etc/libvirt/qemu.conf
if ! grep -qx 'seccomp_sandbox = 0' "$qemu_conf"; then
  sed -i -E 's/^#?\s*seccomp_sandbox\s*=.*/seccomp_sandbox = 0/' "$qemu_conf"
  grep -qx 'seccomp_sandbox = 0' "$qemu_conf" || echo 'seccomp_sandbox = 0' >> "$qemu_conf"
  if pid=$(pgrep -x libvirtd); then
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
fi

# No systemd here: start the daemons ourselves when they are not running.
pgrep -x virtlogd >/dev/null || virtlogd -d
# libvirtd runs under tini as a child subreaper: QEMU processes that libvirt daemonizes are
# reaped at once when they exit. Reparented to this machine's PID 1 they are reaped late, and
# libvirt waits for that on every domain stop (1.3-2 s of every reset, measured).
if ! pgrep -x libvirtd >/dev/null; then
  setsid tini -s -- libvirtd >>/var/log/libvirtd-foreground.log 2>&1 < /dev/null &
fi
for _ in $(seq 1 50); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done

# The project's venv, installed from the host lock (scripts/install-venv.sh; it needs no root).
bash scripts/install-venv.sh
