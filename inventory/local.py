"""The default inventory: this machine is the hypervisor.

    pyinfra -y inventory/local.py deploy.py


LOCK picks the lock (default locks/demo.toml), LAB the lab name (default "default").
"""

import os

from runner.lab.state import lab_name_from_env

lock = os.environ.get("LOCK", "locks/demo.toml")

hypervisors = [
    (
        "@local",
        {
            "libvirt_uri": "qemu:///system",
            "lock": lock,
            "lab": lab_name_from_env(),
        },
    )
]

# The lab's guest (deploy/guest/): the "@lab/<lab>" connector finds it through lab.json.
# `--limit hypervisors` converges the VM alone, `--limit lab_guests` the guest alone.
lab_guests = [(f"@lab/{lab_name_from_env()}", {"lock": lock, "lab": lab_name_from_env()})]
