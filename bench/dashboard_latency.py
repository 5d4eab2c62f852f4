"""Dashboard: event latency from commit to a browser's page, and the dashboard's memory and
CPU with 50 session pages open.

One node, `actfleet dashboard` as a process, headless Chromium. Latency: a session page is
opened before its turn (3 cells and an answer, replayed) is submitted; for each event, the
time its element appeared in the page (a MutationObserver) minus its stream id's
milliseconds (Redis's clock at XADD: the commit). Sequential turns, one page open. Load:
50 pages, each in its own browser context (a browser holds at most 6 HTTP/1.1 connections
to one host per profile, and each page's event stream holds one), on 50 sessions, idle
and then while a turn runs in every session; the dashboard's RSS and CPU from /proc, and
the same latency on all 50 pages.

    .venv/bin/python bench/dashboard_latency.py [--turns 20] [--pages 50]
"""

from __future__ import annotations

import argparse
import json
import time

from _dashboard import SEEN, cpu_seconds, launch_chromium, rss_mib, start_dashboard
from _fleet import Fleet, pct
from playwright.sync_api import sync_playwright

from actfleet.client import Client
from actfleet.dashboard.render import CHUNKS

CELLS = [
    {"text": "Step one.", "code": "import time\nfor i in range(3):\n    print(i); time.sleep(0.1)"},
    {"code": "x = sum(range(10**5))\nprint(x)"},
    {"code": "print('done')"},
    {"text": "All **three** cells ran."},
]


def lags(client: Client, session_id: str, seen: list[dict]) -> list[float]:
    """Per event of the session: ms from its commit to its element in the page."""
    committed = {
        e.id: int(e.id.split("-")[0])
        for e in client.events(session_id, follow=False)
        if not isinstance(e, CHUNKS)
    }
    shown = {s["id"]: s["t"] for s in seen}
    missing = set(committed) - set(shown)
    if missing:
        raise RuntimeError(f"{session_id}: {len(missing)} events never appeared in the page")
    return [shown[i] - committed[i] for i in committed]


def row(name: str, values: list[float]) -> str:
    return (
        f"| {name} | {len(values)} | {pct(values, 50):.1f} | {pct(values, 99):.1f} "
        f"| {max(values):.1f} |"
    )


def sample(pid: int, seconds: float) -> tuple[float, float]:
    """(CPU % of one core, peak RSS MiB) of the process over `seconds`."""
    start_cpu, start, peak = cpu_seconds(pid), time.monotonic(), rss_mib(pid)
    while time.monotonic() - start < seconds:
        time.sleep(0.25)
        peak = max(peak, rss_mib(pid))
    return 100 * (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start), peak


def main(turns: int, pages: int) -> None:
    fleet = Fleet(prefix="bench-dashboard-", deadline=1200)
    fleet.start_redis()
    fleet.start_worker("n1", warm_kernels=4)
    replay = fleet.dir / "cells.jsonl"
    replay.write_text("".join(json.dumps(line) + "\n" for line in CELLS))
    model = f"replay:{replay}"
    client = Client(fleet.redis_url)
    url = start_dashboard(fleet)
    pid = fleet.procs["dashboard"].pid
    with sync_playwright() as p:
        browser = launch_chromium(p)
        sequential: list[float] = []
        for i in range(turns):
            page = browser.new_page()
            page.add_init_script(SEEN)
            session_id = f"s-latency-{i}"
            page.goto(f"{url}/sessions/{session_id}")
            page.wait_for_selector("#connection.ok")
            client.submit("run three cells", model=model, session_id=session_id, approval="auto")
            page.wait_for_selector(".event.TurnFinished", timeout=60_000)
            sequential += lags(client, session_id, page.evaluate("window.seen"))
            page.close()

        idle_cpu, idle_rss = sample(pid, 5)
        open_pages = []
        for i in range(pages):
            page = browser.new_context().new_page()
            page.add_init_script(SEEN)
            page.goto(f"{url}/sessions/s-load-{i}")
            open_pages.append(page)
        for page in open_pages:
            page.wait_for_selector("#connection.ok")
        open_cpu, open_rss = sample(pid, 10)
        started = time.monotonic()
        handles = [
            client.submit("run three cells", model=model, session_id=f"s-load-{i}", approval="auto")
            for i in range(pages)
        ]
        cpu_before = cpu_seconds(pid)
        peak = rss_mib(pid)
        while not all(client.result(h.turn_id) for h in handles):
            time.sleep(0.25)
            peak = max(peak, rss_mib(pid))
        elapsed = time.monotonic() - started
        busy_cpu = 100 * (cpu_seconds(pid) - cpu_before) / elapsed
        loaded: list[float] = []
        for i, page in enumerate(open_pages):
            page.wait_for_selector(".event.TurnFinished", timeout=60_000)
            loaded += lags(client, f"s-load-{i}", page.evaluate("window.seen"))
        browser.close()
    print(f"event latency, commit -> element in the page, ms ({turns} sequential turns)")
    print("| case | events | p50 | p99 | max |\n|---|---|---|---|---|")
    print(row("1 page open, turns one after another", sequential))
    print(row(f"{pages} pages open, a turn in each at once", loaded))
    print(f"\ndashboard process ({pages} pages; turns took {elapsed:.1f} s)")
    print("| state | CPU (% of a core) | RSS (MiB) |\n|---|---|---|")
    print(f"| no page open, after the sequential turns | {idle_cpu:.1f} | {idle_rss:.0f} |")
    print(f"| {pages} pages open, idle | {open_cpu:.1f} | {open_rss:.0f} |")
    print(f"| {pages} pages open, a turn in each | {busy_cpu:.1f} | {peak:.0f} (peak) |")
    fleet.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--pages", type=int, default=50)
    args = parser.parse_args()
    main(args.turns, args.pages)
