"""How soon `actfleet run ... | cat` (no terminal, an `ask` policy) tells on stderr how to
decide a request: from the request's `created_at` to the hint line read (target: 2 s).

    .venv/bin/python bench/approval_hint.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from _fleet import Fleet, pct

from actfleet.client import Client


def main(runs: int) -> None:
    fleet = Fleet("bench-hint-")
    fleet.start_redis()
    fleet.start_worker("hint")
    client = Client(fleet.redis_url)
    replay = fleet.dir / "ask.jsonl"
    replay.write_text(json.dumps({"code": "print(1)"}) + "\n" + json.dumps({"text": "ok"}) + "\n")
    command = [sys.executable, "-m", "actfleet", "run", "go", "--model", f"replay:{replay}"]
    env = {"ACTFLEET_REDIS_URL": fleet.redis_url}
    delays: list[float] = []
    try:
        for _ in range(runs):
            run = subprocess.Popen(
                command,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert run.stderr is not None
            for line in run.stderr:
                if found := re.search(r"actfleet approve (\S+)", line):
                    told = time.time()
                    record = client.request(found[1])
                    delays.append((told - record.created_at) * 1000)
                    client.approve(found[1], args_sha256=record.args_sha256)
                    break
            run.wait(60)
    finally:
        client.close()
        fleet.stop()
    print(f"request created -> hint on stderr, {len(delays)} runs, ms")
    print(f"p50 {pct(delays, 50):.0f}, p95 {pct(delays, 95):.0f}, max {max(delays):.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    main(parser.parse_args().runs)
