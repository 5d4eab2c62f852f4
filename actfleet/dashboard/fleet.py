"""The Fleet page: nodes as they report on each beat, queue depths, dead letters, parked
turns, and a link to Flower."""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from actfleet.broker.transitions import text
from actfleet.client.sdk import Client
from actfleet.dashboard.pages import page, threaded


@dataclass(frozen=True)
class NodeView:
    name: str
    alive: bool
    heartbeat_age: float | None
    """Seconds since the node's last beat (None: no report)."""
    capacity: int
    runtimes: int
    kernels: int
    running: list[str]
    queued: int


@dataclass(frozen=True)
class FleetView:
    nodes: list[NodeView]
    shared_queue: int
    dead_letters: list[dict]
    dead_letter_count: int
    parked_turns: int
    pending_approvals: int


def read_fleet(client: Client) -> FleetView:
    """One read of what the nodes and queues report."""
    keys, r = client.keys, client.redis
    names = sorted(text(n) for n in r.smembers(keys.nodes()))
    with r.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.exists(keys.node(name))
            pipe.hgetall(keys.node_info(name))
            pipe.llen(keys.node_queue(name))
        pipe.llen(keys.shared_queue())
        pipe.llen(keys.dead_letters())
        replies = pipe.execute()
    now = time.time()
    nodes = []
    for i, name in enumerate(names):
        alive, raw, queued = replies[3 * i : 3 * i + 3]
        info = {text(k): text(v) for k, v in raw.items()}
        beat = _number(info.get("beat"))
        running = info.get("running", "")
        nodes.append(
            NodeView(
                name=name,
                alive=bool(alive),
                heartbeat_age=now - beat if beat else None,
                capacity=int(_number(info.get("capacity"))),
                runtimes=int(_number(info.get("runtimes"))),
                kernels=int(_number(info.get("kernels"))),
                running=running.split("\n") if running else [],
                queued=queued,
            )
        )
    pending = client.pending()
    return FleetView(
        nodes=nodes,
        shared_queue=replies[-2],
        dead_letters=client.dead_letters(10),
        dead_letter_count=replies[-1],
        parked_turns=len({p.turn_id for p in pending}),
        pending_approvals=len(pending),
    )


def _number(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


async def fleet_page(request: Request) -> Response:
    view = await threaded(read_fleet, request.app.state.client)
    return page(request, "fleet.html", fleet=view)
