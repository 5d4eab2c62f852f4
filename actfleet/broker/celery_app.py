"""The Celery app: the wire between clients and nodes. Tasks are sent by name, so a client
never imports the worker code."""

from __future__ import annotations

from celery import Celery

from actfleet.broker.keys import Keys
from actfleet.broker.records import StepRef
from actfleet.broker.settings import Settings
from actfleet.broker.transport import DEAD_LETTERS_MAX_OPTION, DEAD_LETTERS_OPTION

MODEL_STEP = "actfleet.model_step"
EXECUTION_STEP = "actfleet.execution_step"
COLLECT_STEP = "actfleet.collect_step"


def step_task(kind: str) -> str:
    """The task name of a step kind (model, execution, collect)."""
    return f"actfleet.{kind}_step"


def make_celery(settings: Settings) -> Celery:
    """A Celery app on the settings' Redis, configured for bounded, idempotent steps."""
    app = Celery("actfleet", broker=settings.redis_url)
    app.conf.update(
        broker_transport="actfleet.broker.transport:Transport",
        task_serializer="msgpack",
        accept_content=["msgpack"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=Keys(settings.key_prefix).shared_queue(),
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            DEAD_LETTERS_OPTION: Keys(settings.key_prefix).dead_letters(),
            DEAD_LETTERS_MAX_OPTION: settings.dead_letters_max,
        },
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
    )
    return app


def send_step(app: Celery, ref: StepRef, queue: str) -> None:
    """Enqueue a step on a queue: the task of its kind, with the encoded `StepRef` as its
    one argument."""
    app.send_task(step_task(ref.kind), args=[ref.encode()], queue=queue, routing_key=queue)
