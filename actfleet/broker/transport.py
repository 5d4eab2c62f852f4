"""kombu's Redis transport, made to survive a message it cannot read: kombu decodes the
envelope of each popped message itself and lets a decoding error stop the worker, so any
process that reaches Redis could stop a node with one malformed message. Here the message
(already popped) goes to the dead-letter list with the reason, and the worker goes on."""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis

from actfleet.broker.dead_letters import KEEP, dead_letter

log = logging.getLogger("actfleet.transport")


class Channel(kombu_redis.Channel):
    def _brpop_read(self, **options: Any) -> bool:
        try:
            return super()._brpop_read(**options)
        except (Empty, *self.connection_errors):
            raise
        except Exception as exc:
            body = getattr(exc, "doc", "")
            reason = f"unreadable message envelope: {type(exc).__name__}: {exc}"[:300]
            log.warning("dead letter from a queue: %s", reason)
            prefix = self._queue_cycle.items[0] if self._queue_cycle.items else "actfleet"
            key = f"{str(prefix).split('.', 1)[0]}:deadletters"
            with self.conn_or_acquire() as client:
                client.lpush(key, dead_letter("queue", body, reason))
                client.ltrim(key, 0, KEEP - 1)
            return True


class Transport(kombu_redis.Transport):
    Channel = Channel
