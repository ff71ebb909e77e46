"""The lab, converged: hypervisor prerequisites, the image, the lab VM, SSH answering.

    pyinfra -y inventory/local.py deploy.py

Only composes; the steps live in deploy/ and images/. A second run changes nothing.
"""

from pathlib import Path

from pyinfra import host

from deploy.errors import one_line_errors
from deploy.hypervisor import hypervisor_prerequisites
from deploy.lab import lab_vm, prepare_lab
from images.store import ImageStore
from runner.lab import HypervisorPaths, LabPaths
from runner.lock import load_lock

with one_line_errors():
    lock = load_lock(Path(host.data.lock))
    lab = host.data.lab
    pool_dir = (
        Path(host.data.lab_root) / lab / "pool"
        if host.data.get("lab_root")
        else LabPaths.for_lab(lab).local_pool_dir
    )

    hypervisor_prerequisites(guest_arch=lock.guest.arch)

    store = ImageStore()
    manifest = store.build(lock.guest)
    image = store.entry(manifest.input_hash)

    state = prepare_lab(
        lab, lock, manifest, image, host.data.libvirt_uri, HypervisorPaths(pool_dir)
    )
    lab_vm(state=state, lock=lock, manifest=manifest, image=image)
