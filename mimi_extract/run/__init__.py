"""One extraction run, start to end: ``runner`` (discover, identity, lock, plan, encode, write)."""
