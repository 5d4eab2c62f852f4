"""The Celery tasks: thin, synchronous wrappers that hand each step to the node's loop."""

from __future__ import annotations

import json
import reprlib

from celery import Celery

from actfleet.broker.celery_app import step_task
from actfleet.broker.records import STEP_KINDS, BadRecord, StepRef
from actfleet.workers.node import Node


def register(app: Celery, node: Node) -> None:
    """Bind the step tasks of `app` to this node."""
    for kind in STEP_KINDS:
        app.task(name=step_task(kind), bind=True)(_runner(node, kind))


def _runner(node: Node, kind: str):  # noqa: ANN202 - a Celery task body
    def run(task: object, /, *args: object, **kwargs: object) -> None:
        try:
            if kwargs or len(args) != 1:
                raise BadRecord(
                    f"a step task takes one argument, got {len(args)} and {len(kwargs)} keyword(s)"
                )
            ref = StepRef.decode(args[0])
            if ref.kind != kind:
                raise BadRecord(f"{ref.encode()} is a {ref.kind} step, sent as a {kind} step")
        except BadRecord as exc:
            reason = f"malformed {kind} step message: {exc}"
            body = _body(args, kwargs)
            node.call(node.ctx.dead_letter("step", body, reason))
            return
        node.call(node.steps.run(ref))

    run.__name__ = f"{kind}_step"
    return run


def _body(args: tuple[object, ...], kwargs: dict[str, object]) -> str:
    """A malformed message's arguments for its dead letter: JSON, or a bounded repr when
    JSON cannot hold them (bytes keys, nesting too deep)."""
    try:
        return json.dumps([args, kwargs], default=repr)
    except (TypeError, ValueError, RecursionError):
        return reprlib.repr([args, kwargs])
