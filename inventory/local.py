"""The default inventory: this machine is the hypervisor.

    pyinfra -y inventory/local.py deploy.py


LOCK picks the lock (default locks/demo.toml), LAB the lab name (default "default").
"""

import os

from runner.lab import lab_name_from_env

hypervisors = [
    (
        "@local",
        {
            "libvirt_uri": "qemu:///system",
            "lock": os.environ.get("LOCK", "locks/demo.toml"),
            "lab": lab_name_from_env(),
        },
    )
]
