"""Files and formats every stage shares: atomic writes, output sets, JSON Lines, numbers as shown.

The lowest layer but errors and records.
"""
