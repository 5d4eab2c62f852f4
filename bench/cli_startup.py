"""CLI start-up: wall time of `python -m actfleet --help`, beside a bare `python -c pass`.

The CLI imports no model, kernel or Celery code for `--help` (tests/test_cli.py checks the
imports); this is the time that check buys, which tests/test_cli.py used to assert
(`< 1 s`). Runs are sequential, after warm-up runs that fill the OS file cache; no Redis.

    .venv/bin/python bench/cli_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _fleet import ROOT, pct

COMMANDS = {
    "python -m actfleet --help": [sys.executable, "-m", "actfleet", "--help"],
    "python -c pass (interpreter alone)": [sys.executable, "-c", "pass"],
}


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, timeout=60, cwd=ROOT)
    return time.perf_counter() - started


def main(runs: int, warmup: int) -> None:
    print(f"{runs} runs each, ms")
    print(f"{'':<38}{'p50':>8}{'p95':>8}{'max':>8}")
    for name, argv in COMMANDS.items():
        for _ in range(warmup):
            timed(argv)
        ms = [timed(argv) * 1000 for _ in range(runs)]
        print(f"{name:<38}{pct(ms, 50):>8.1f}{pct(ms, 95):>8.1f}{max(ms):>8.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    main(args.runs, args.warmup)
