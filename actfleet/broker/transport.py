"""kombu's Redis transport, made to survive a message it cannot read: kombu decodes the
envelope of each popped message itself and lets a decoding error stop the worker, so any
process that reaches Redis could stop a node with one malformed message. Here the message
(already popped) goes to the dead-letter list with the reason, and the worker goes on."""

from __future__ import annotations

import json
import logging
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str

from actfleet.broker.dead_letters import dead_letter, push

log = logging.getLogger("actfleet.transport")

DEAD_LETTERS_OPTION = "dead_letters"
"""The transport option naming the dead-letter list (`Keys.dead_letters()`)."""
DEAD_LETTERS_MAX_OPTION = "dead_letters_max"
"""The transport option: how many dead letters are kept."""


class Undeliverable(Exception):
    """kombu or Celery could not make a message of a popped payload."""

    def __init__(self, payload: Any, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.payload = payload


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        """kombu's connection parameters, remembered. When the connection to Redis is
        lost, kombu clears the transport's client before the channel has put its
        unacknowledged messages back, and before the steps still running acknowledge
        theirs; each of those then failed with an AttributeError that stopped the node
        (Celery: "Unrecoverable error"). With the parameters remembered, they reach Redis
        again (or fail with a connection error, which kombu and Celery handle)."""
        remembered = self.__dict__.setdefault("_remembered_connparams", {})
        if self.connection.client is None and asynchronous in remembered:
            return dict(remembered[asynchronous])
        params = super()._connparams(asynchronous=asynchronous)
        remembered[asynchronous] = dict(params)
        return params

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return super()._brpop_read(**options)
        except (Empty, *_io_errors(self.connection_errors)):
            raise
        except Undeliverable as exc:
            self.dead_letter(_dumps(exc.payload), f"unreadable message envelope: {exc}")
        except Exception as exc:
            reason = f"unreadable message envelope: {type(exc).__name__}: {exc}"
            self.dead_letter(getattr(exc, "doc", ""), reason)
        return True

    def _handle_message(self, client: Any, r: Any) -> Any:
        """A broadcast message kombu would drop with only a log line (empty, or not JSON)
        is dead-lettered here and skipped (kombu skips a message whose data is empty)."""
        payload = super()._handle_message(client, r)
        if bytes_to_str(payload["type"]).endswith("message"):
            data = payload["data"]
            try:
                if not data:
                    raise ValueError("empty message")
                json.loads(data)
            except (ValueError, RecursionError) as exc:
                reason = f"unreadable broadcast message: {type(exc).__name__}: {exc}"
                self.dead_letter(data, reason)
                return {**payload, "data": b""}
        return payload

    def _receive_one(self, c: Any) -> Any:
        try:
            return super()._receive_one(c)
        except Undeliverable as exc:
            self.dead_letter(_dumps(exc.payload), f"unreadable broadcast message: {exc}")
            return True

    def dead_letter(self, body: Any, reason: str) -> None:
        """Keep a message this node could not run, with the reason; log it once."""
        reason = reason[:300]
        log.warning("dead letter: %s", reason)
        options = self.connection.client.transport_options
        with self.conn_or_acquire() as client:
            entry = dead_letter("queue", body, reason)
            push(client, options[DEAD_LETTERS_OPTION], entry, options[DEAD_LETTERS_MAX_OPTION])


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message: Any, queue: str) -> None:
        try:
            super()._deliver(message, queue)
        except (Empty, *_io_errors(self.connection_errors)):
            raise
        except Exception as exc:
            raise Undeliverable(message, exc) from exc


def _io_errors(connection_errors: tuple[type[Exception], ...]) -> tuple[type[Exception], ...]:
    """kombu counts KeyError as a connection error (it reconnects on one); a KeyError while
    reading a message means a malformed message, not a lost connection."""
    return tuple(error for error in connection_errors if error is not KeyError)


def _dumps(payload: Any) -> str:
    try:
        return json.dumps(payload)
    except (TypeError, ValueError):
        return repr(payload)
