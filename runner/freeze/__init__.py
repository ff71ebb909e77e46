"""Recording the guest's frozen state (manifest, snapshot) and returning to it (reset)."""
