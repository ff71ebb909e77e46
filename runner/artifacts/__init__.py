"""Resolving a lock: every pinned artifact fetched from its registry into the host cache."""
