"""Messages that could not be read, kept with the reason in one trimmed list, so a bad
message is skipped and seen instead of stopping whoever met it."""

from __future__ import annotations

import json
import time
from typing import Any

from actfleet.broker.keys import Keys

PREVIEW = 300
"""Bytes of a bad message kept (never the whole of a huge one)."""
KEEP = 10_000


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


async def record_dead_letter(redis: Any, keys: Keys, source: str, body: Any, reason: str) -> None:
    """Keep a bad message (asyncio client)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.lpush(keys.dead_letters(), dead_letter(source, body, reason))
        pipe.ltrim(keys.dead_letters(), 0, KEEP - 1)
        await pipe.execute()
