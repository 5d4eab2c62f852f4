"""Celery's consumer, with each message it cannot run dead-lettered with the reason: Celery
only logs such a message (with a traceback, at CRITICAL for an undecodable body) and drops
it, so nobody sees what was lost or who sent it."""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.message import Message

log = logging.getLogger("actfleet.consumer")


class Consumer(CeleryConsumer):
    """Dead-letters undecodable bodies, disallowed content types, unknown and invalid tasks."""

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        _dead_letter(message, f"undecodable message body ({message.content_type}): {exc}")
        message.ack()

    def on_unknown_message(self, body: Any, message: Message) -> None:
        _dead_letter(message, "not a Celery task message (no task name in its headers)")
        message.reject_log_error(log, self.connection_errors)

    def on_unknown_task(self, body: Any, message: Message, exc: Exception) -> None:
        _dead_letter(message, f"unknown task {_task_name(message)!r}; nodes run step tasks only")
        message.reject_log_error(log, self.connection_errors)

    def on_invalid_task(self, body: Any, message: Message, exc: Exception) -> None:
        _dead_letter(message, f"invalid task message ({message.content_type}): {exc}")
        message.reject_log_error(log, self.connection_errors)


def _dead_letter(message: Message, reason: str) -> None:
    message.channel.dead_letter(message.body, reason)


def _task_name(message: Message) -> str:
    headers = message.headers if isinstance(message.headers, dict) else {}
    return str(headers.get("task", "?"))[:100]
