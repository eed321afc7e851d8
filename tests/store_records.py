"""Generation records made up for a store: the raw fields a store round-trips, and a checked record's JSON."""

from __future__ import annotations

import hashlib

from procexec.records import GenerationRecord


def key(n: int) -> str:
    """A store key (64 hex digits) of its own for each ``n``."""
    return hashlib.sha256(str(n).encode()).hexdigest()


def record(n: int, tokens: int = 5, finish: str = "stop", offsets=True) -> dict:
    """A stored record's fields as a store holds them, with text a lossy codec would change (a lone surrogate, a
    non-ASCII character, token ids past 16 bits, a nested provenance)."""
    text = "".join(f"t{i}" for i in range(tokens)) + "\ud800\u20ac"
    return {
        "id": f"d:5:{n}",
        "attempt": 1,
        "text": text,
        "num_generated_tokens": tokens,
        "finish_reason": finish,
        "token_ids": [n + i * 70_000 for i in range(tokens)],
        "token_offsets": [2 * i + (300_000 if i == tokens - 1 else 0) for i in range(tokens)] if offsets else None,
        "prompt_sha256": "ab",
        "provenance": {"cache_key": key(n), "nested": {"x": [1.5, None]}},
    }


def generation_record(example_id, length, attempt, tokens, finish, continued=0):
    """A checked record of tiny-llama as JSON: ``tokens`` generated; with ``continued``, a continuation of attempt 1
    whose first ``continued`` tokens are attempt 1's."""
    provenance = {"continued_tokens": continued} if continued else {}
    return GenerationRecord(
        id=example_id, model="tiny-llama", dataset="add_int_1-10_k1", length=length, index=int(example_id[-1]),
        attempt=attempt, text="x" * tokens, num_generated_tokens=tokens, finish_reason=finish,
        prompt_tokens=100, continues_attempt=1 if continued else None, provenance=provenance,
    ).to_json()  # fmt: skip
