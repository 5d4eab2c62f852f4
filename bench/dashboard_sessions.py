"""Dashboard: the Sessions page with 1,000 sessions, first page (50 rows) in a browser and
over HTTP, unfiltered and filtered.

The sessions are real: a batch of 1,000 replayed items (an answer each, no code) run by two
nodes. Then `actfleet dashboard` serves the page; over HTTP (httpx, time to the last byte)
and in headless Chromium (navigation start to the load event, from the page's Navigation
Timing), each several times.

    .venv/bin/python bench/dashboard_sessions.py [--sessions 1000] [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
from _dashboard import launch_chromium, start_dashboard
from _fleet import Fleet, pct
from playwright.sync_api import sync_playwright

from actfleet.client import Client

LOADED = "(() => { const t = performance.getEntriesByType('navigation')[0];"
LOADED += " return t.loadEventEnd - t.startTime; })()"


def main(sessions: int, runs: int) -> None:
    fleet = Fleet(prefix="bench-sessions-", deadline=1800)
    fleet.start_redis()
    fleet.start_worker("n1", warm_kernels=0)
    fleet.start_worker("n2", warm_kernels=0)
    replay = fleet.dir / "answer.jsonl"
    replay.write_text(json.dumps({"text": "42"}) + "\n")
    items = fleet.dir / "items.jsonl"
    items.write_text(
        "".join(
            json.dumps({"custom_id": f"item-{i}", "prompt": f"item {i}"}) + "\n"
            for i in range(sessions)
        )
    )
    client = Client(fleet.redis_url)
    started = time.monotonic()
    batch = client.submit_batch(items, model=f"replay:{replay}", concurrency=64)
    batch.wait(timeout=1500)
    made = time.monotonic() - started
    assert client.redis.zcard(client.keys.sessions()) == sessions
    url = start_dashboard(fleet)
    some = client.sessions(limit=1)[0][0]
    cases = [
        ("first page, no filter", "/sessions"),
        ("status=finished (reads every session)", "/sessions?status=finished"),
        ("search by part of an id", f"/sessions?search={some[2:8]}"),
        ("the batch's sessions", f"/sessions?batch={batch.id}"),
    ]
    http: dict[str, list[float]] = {}
    with httpx.Client(base_url=url, timeout=30) as web:
        for name, path in cases:
            web.get(path).raise_for_status()  # warm-up
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                web.get(path).raise_for_status()
                times.append((time.perf_counter() - start) * 1000)
            http[name] = times
    browser_ms: dict[str, list[float]] = {}
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page()
        for name, path in cases:
            page.goto(url + path)
            browser_ms[name] = []
            for _ in range(runs):
                page.goto(url + path)
                browser_ms[name].append(page.evaluate(LOADED))
        rows = page.locator("table tr").count() - 1
        browser.close()
    print(f"{sessions} sessions (made by a batch in {made:.0f} s); {rows} rows on a page")
    print("| page | HTTP p50 | HTTP p99 | browser load p50 | browser load p99 |")
    print("|---|---|---|---|---|")
    for name, _ in cases:
        h, b = http[name], browser_ms[name]
        print(
            f"| {name} | {pct(h, 50):.0f} | {pct(h, 99):.0f} | {pct(b, 50):.0f} "
            f"| {pct(b, 99):.0f} |"
        )
    fleet.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    main(args.sessions, args.runs)
