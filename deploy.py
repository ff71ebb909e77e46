"""The lab, converged: hypervisor prerequisites, the image, the lab VM, SSH answering, and
the guest provisioned offline from the host's artifact store.

    pyinfra -y inventory/local.py deploy.py

Only composes; the steps live in deploy/ and images/. A second run changes nothing.
"""

from pathlib import Path

from pyinfra import host

from deploy.errors import one_line_errors
from deploy.guest.plan import plan_guest
from deploy.guest.provision import guest_provisioning
from deploy.hypervisor import hypervisor_prerequisites
from deploy.lab import SSH_WAIT_SECONDS, lab_vm, prepare_lab
from deploy.operations.guest import ssh_answers
from images.store import ImageStore
from runner.lab.state import HypervisorPaths, LabPaths
from runner.spec.resolution import load_resolved_lock

with one_line_errors():
    # With its resolution: the lab is deployed for the resolved environment's fingerprint.
    lock = load_resolved_lock(Path(host.data.lock))
    lab = host.data.lab
    if not host.data.get("lab_guest"):
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

    # ---- Guest side (deploy/guest/), on the "@lab/<lab>" host, once the VM is up ----------
    # Every host runs this one operation: pyinfra orders operations per host, and this shared
    # one puts the guest's operations after the hypervisor's.
    ssh_answers(name="Lab guest answers SSH", lab=lab, wait_seconds=SSH_WAIT_SECONDS)
    if host.data.get("lab_guest"):
        guest_provisioning(plan=plan_guest(lock, Path(host.data.lock), lab))
