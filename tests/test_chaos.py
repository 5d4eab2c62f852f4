"""The chaos suite, small: the scenarios of bench/chaos.py, run by the same code with
fewer sessions, kills and restarts, one after the other on one fleet
(`.venv/bin/python bench/chaos.py all` runs the full ones). Each scenario prints its
table; a failed must-hold fails the test with it."""

from __future__ import annotations

import random

from bench.chaos import run_small


def test_kills_a_redis_restart_and_junk_lose_strand_and_run_twice_nothing():
    seed = random.randrange(1_000_000)  # in the kills table: a failure can be replayed
    reports = run_small(nodes=3, seed=seed)
    tables = "\n".join(report.table() for report in reports)
    print(tables)
    assert [r.scenario for r in reports if not r.ok] == [], tables
