"""A remote hypervisor over SSH: ``LAB_HYPERVISOR=host LAB_HYPERVISOR_USER=user pyinfra -y
inventory/remote.py deploy.py``. pyinfra reaches the host over SSH for its prerequisites; libvirt
is driven from here over ``qemu+ssh://``; the image files are uploaded into the remote pool.

LAB_HYPERVISOR_ROOT is where the lab's pool and console log live on that host.
"""

import os
import sys

from runner.lab.state import lab_name_from_env

hostname = os.environ.get("LAB_HYPERVISOR")
if not hostname:
    sys.exit("inventory/remote.py: set LAB_HYPERVISOR (and LAB_HYPERVISOR_USER, default root)")
user = os.environ.get("LAB_HYPERVISOR_USER", "root")

hypervisors = [
    (
        hostname,
        {
            "ssh_user": user,
            "libvirt_uri": f"qemu+ssh://{user}@{hostname}/system",
            "lab_root": os.environ.get("LAB_HYPERVISOR_ROOT", "/var/lib/frozen-bench/lab"),
            "lock": os.environ.get("LOCK", "locks/demo.toml"),
            "lab": lab_name_from_env(),
        },
    )
]
