"""Read a store directory the way a restarted job does (tests only)."""

from __future__ import annotations

from pathlib import Path

from procexec.generation.store import Store, entries_of


def stored_records(directory: Path) -> dict[str, dict]:
    """key -> record of every generation in the store."""
    store = Store(directory, "test-reader")
    store.load()
    return {entry.key: store.get(entry.key) for seg in sorted(directory.glob("*.seg")) for entry in entries_of(seg)}


def stored_keys(directory: Path) -> list[str]:
    """Every stored entry's key, duplicates included (a key stored twice shows twice)."""
    return [e.key for seg in sorted(directory.glob("*.seg")) for e in entries_of(seg)]
