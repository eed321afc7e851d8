"""Files and formats every stage shares: atomic writes, output sets, JSON Lines (the lowest layer but errors and records)."""
