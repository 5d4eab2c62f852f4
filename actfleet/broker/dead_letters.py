"""Messages that could not be read, kept with the reason in one trimmed list, so a bad
message is skipped and seen instead of stopping whoever met it."""

from __future__ import annotations

import json
import time
from typing import Any

PREVIEW = 300
"""Bytes of a bad message kept (never the whole of a huge one)."""


def dead_letter(source: str, body: Any, reason: str) -> str:
    """The JSON entry for one bad message."""
    raw = body if isinstance(body, bytes) else str(body).encode(errors="replace")
    return json.dumps(
        {
            "source": source,
            "reason": reason,
            "size": len(raw),
            "preview": raw[:PREVIEW].decode(errors="replace"),
            "ts": time.time(),
        }
    )


def push(client: Any, key: str, entry: str, keep: int) -> Any:
    """Add an entry to the dead-letter list and trim it to `keep` (sync or asyncio client:
    returns what the pipeline's `execute` returns)."""
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, entry)
    pipe.ltrim(key, 0, keep - 1)
    return pipe.execute()
