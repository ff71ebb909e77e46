"""The lab VM as both stages see it: its state file, libvirt access, the guest transport, the
guest's filesystem layout, snapshots and teardown. deploy/ converges a lab; runner/ drives it."""
