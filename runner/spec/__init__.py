"""What a run asks for and what was found for it: the lock (TOML a person writes) and its
resolution (every artifact pinned by digest), read by every stage."""
