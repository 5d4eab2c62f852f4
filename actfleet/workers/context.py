"""What a step needs from its node: Redis, key names, settings, the node's name, and how
to send a step. Steps take this small object instead of the node, so the worker modules
import each other in one direction only."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from actfleet.broker.dead_letters import dead_letter, push
from actfleet.broker.events import Event
from actfleet.broker.keys import Keys
from actfleet.broker.records import StepRef
from actfleet.broker.settings import Settings
from actfleet.broker.stream import ChunkCoalescer, emit
from actfleet.broker.transitions import route
from actfleet.workers.mcp_servers import McpServers

log = logging.getLogger("actfleet.node")


@dataclass
class NodeContext:
    name: str
    boot: str
    settings: Settings
    redis: Any
    """The node's asyncio Redis client (retrying, see broker/connection.py)."""
    publish: Callable[[StepRef, str], None]
    """Puts a step's message on a queue (Celery)."""
    mcp: McpServers = field(default_factory=McpServers)
    """The node's configured MCP servers (mcp_servers.py)."""
    keys: Keys = field(init=False)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.key_prefix)

    @property
    def queue(self) -> str:
        """This node's own queue."""
        return self.keys.node_queue(self.name)

    async def send(self, refs: Iterable[StepRef]) -> None:
        """Send steps to the nodes holding their agents' runtimes (or the shared queue)."""
        for ref in refs:
            lease = await self.redis.get(self.keys.lease(ref.session_id, ref.agent_id))
            self.publish(ref, route(self.keys, lease))

    async def dead_letter(self, source: str, body: Any, reason: str) -> None:
        """Keep a message or record that could not be read, with the reason; log it once."""
        log.warning("dead letter from %s: %s", source, reason)
        entry = dead_letter(source, body, reason)
        await push(self.redis, self.keys.dead_letters(), entry, self.settings.dead_letters_max)

    async def emit(self, events: list[Event]) -> None:
        await emit(self.redis, self.keys, self.settings.stream_maxlen, events)

    def coalescer(self) -> ChunkCoalescer:
        s = self.settings
        return ChunkCoalescer(
            self.redis, self.keys, s.stream_maxlen, s.chunk_flush_ms, s.chunk_flush_bytes
        )
