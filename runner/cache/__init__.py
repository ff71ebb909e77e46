"""The host's content-addressed artifact cache: the paths object that owns it and the store."""
