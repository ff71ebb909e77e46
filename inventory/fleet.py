"""A fleet's labs on this machine, one per host of the fleet file:

    FLEET=fleets/local.toml LOCK=locks/demo.toml pyinfra -y inventory/fleet.py deploy.py

Each host of the fleet file (runner.spec.fleet) is one lab: its hypervisor is this machine
("@hypervisor/<lab>", deploy/hypervisor_connector.py) and its guest "@lab/<lab>". pyinfra
converges them side by side; `runner freeze --lab <lab>` then freezes each, and every host's
worker (`runner fleet worker`) reports its freeze to the controller, which refuses a fleet whose
labs are not frozen for the same environment. A host of another machine (``ssh`` in the fleet
file) is deployed there, with that machine's own checkout (README, "A fleet of machines").
"""

import os
import sys
from pathlib import Path

from runner.spec.fleet import load_fleet

fleet = load_fleet(Path(os.environ.get("FLEET", "fleets/local.toml")))
lock = os.environ.get("LOCK", "locks/demo.toml")
elsewhere = [host.name for host in fleet.hosts if host.ssh is not None]
if elsewhere:
    sys.exit(
        f"inventory/fleet.py: hosts {', '.join(elsewhere)} are other machines: deploy each there "
        "with inventory/local.py (README, A fleet of machines)"
    )

hypervisors = [
    (
        f"@hypervisor/{host.lab}",
        {"libvirt_uri": "qemu:///system", "lock": lock, "lab": host.lab},
    )
    for host in fleet.hosts
]
lab_guests = [(f"@lab/{host.lab}", {"lock": lock, "lab": host.lab}) for host in fleet.hosts]
