"""Decision to execution start: from the moment a client calls `approve` on a parked turn
to the moment the approved cell starts running in the kernel.

The turn is parked (`approval="ask"`) with no worker held; the decision goes through the
reply channel (the decide script, then the step sent to the agent's node); the cell's first
statement prints `time.time()`, which is compared with the client's clock just before
`approve` (same machine). The session's kernel is warmed by a first turn, so the figure is
the channel and the step machine, not a kernel start.

    .venv/bin/python bench/decision_latency.py [--turns 50]

Target: p50 at most 20 ms.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _fleet import Fleet, pct

from actfleet.broker.events import ApprovalRequest, CodeExecutionOutput
from actfleet.client import Client

TARGET_P50_MS = 20.0
CELL = "import time; print(repr(time.time()))"


def main(turns: int) -> None:
    fleet = Fleet("bench-decision-")
    fleet.start_redis()
    fleet.start_worker("bench-1")
    try:
        client = Client(fleet.redis_url)
        replay = Path(fleet.dir) / "decide.jsonl"
        lines = [{"code": "warm = 1"}, {"text": "warm"}]
        lines += [{"code": CELL}, {"text": "ok"}] * turns
        replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
        model = f"replay:{replay}"
        first = client.submit("warm up", model=model, approval="auto")
        client.wait(first, timeout=60)
        session = first.session_id
        delays = []
        for _ in range(turns):
            cursor = client.last_event_id(session)
            handle = client.submit("go", model=model, approval="ask", session_id=session)
            request = next(
                e for e in client.events(session, cursor) if isinstance(e, ApprovalRequest)
            )
            decided = time.time()
            client.approve(request.request_id, args_sha256=request.args_sha256)
            output = next(
                e for e in client.events(session, request.id) if isinstance(e, CodeExecutionOutput)
            )
            delays.append((float(output.text.strip()) - decided) * 1000)
            client.wait(handle, timeout=60)
        p50, p99 = pct(delays, 50), pct(delays, 99)
        print(f"decision -> execution start, {turns} turns, 1 node")
        print(
            f"  p50 {p50:.1f} ms   p99 {p99:.1f} ms   (target p50 <= {TARGET_P50_MS:.0f} ms: "
            f"{'met' if p50 <= TARGET_P50_MS else 'MISSED'})"
        )
    finally:
        fleet.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    main(parser.parse_args().turns)
