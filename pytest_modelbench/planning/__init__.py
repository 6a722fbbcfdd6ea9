"""Planning: models × variants × seeds → items, and the fingerprint of what produces an item's results."""
