"""The run store: atomic files, per-item journals, the locked manifest, the typed records written there, and what tests receive."""
