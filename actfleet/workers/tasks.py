"""The Celery tasks: thin, synchronous wrappers that hand each step to the node's loop."""

from __future__ import annotations

from celery import Celery

from actfleet.broker.celery_app import COLLECT_STEP, EXECUTION_STEP, MODEL_STEP
from actfleet.workers.node import Node
from actfleet.workers.steps import run_step


def register(app: Celery, node: Node) -> None:
    """Bind the step tasks of `app` to this node."""

    @app.task(name=MODEL_STEP)
    def model_step(session_id: str, agent_id: str, turn_id: str, step_no: int) -> None:
        node.call(run_step(node, "model", session_id, agent_id, turn_id, step_no))

    @app.task(name=EXECUTION_STEP)
    def execution_step(session_id: str, agent_id: str, turn_id: str, step_no: int) -> None:
        node.call(run_step(node, "execution", session_id, agent_id, turn_id, step_no))

    @app.task(name=COLLECT_STEP)
    def collect_step(session_id: str, agent_id: str, turn_id: str, step_no: int) -> None:
        node.call(run_step(node, "collect", session_id, agent_id, turn_id, step_no))
