"""Screenshots of every dashboard page for docs/screenshots/, from a real fleet.

Starts a private redis-server, two nodes and `actfleet dashboard`, runs replayed sessions
(a plot, the package's examples, one left waiting for an approval, a batch done and
one waiting for approvals), then
saves fleet, sessions, session, approvals, batches and batch .png with headless Chromium.

    .venv/bin/python bench/dashboard_screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from _dashboard import launch_chromium, start_dashboard
from _fleet import ROOT, Fleet, wait_for
from playwright.sync_api import sync_playwright

from actfleet.client import Client

EXAMPLES = ROOT / "actfleet" / "examples"
PLOT = [
    {
        "text": "I'll plot the first 20 Fibonacci numbers on a log scale.",
        "code": (
            "import matplotlib.pyplot as plt\n"
            "fib = [1, 1]\nwhile len(fib) < 20:\n    fib.append(fib[-1] + fib[-2])\n"
            "plt.figure(figsize=(6, 3.2))\nplt.semilogy(range(1, 21), fib, marker='o')\n"
            "plt.title('Fibonacci numbers')\nplt.xlabel('n')\nplt.grid(True, alpha=0.3)\n"
            "plt.show()\nprint(f'F(20) = {fib[-1]}')"
        ),
    },
    {
        "text": "The points fall on a straight line on a log scale: the numbers grow "
        "**exponentially**, by about φ ≈ 1.618 a step. F(20) = 6765."
    },
]
CLEANUP = [
    {
        "text": "I'll remove the scratch files older than a week.",
        "code": (
            "import pathlib, time\n"
            "old = [p for p in pathlib.Path('scratch').glob('*.tmp')\n"
            "       if time.time() - p.stat().st_mtime > 7 * 86400]\n"
            "for p in old:\n    p.unlink()\nprint(f'removed {len(old)} files')"
        ),
    },
    {"text": "Done."},
]


def write_replay(directory: Path, name: str, lines: list[dict]) -> str:
    path = directory / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return f"replay:{path}"


def write_items(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def run_sessions(client: Client, directory: Path) -> tuple[str, str]:
    """Every session the pages show; returns the plot session's id and the id of a batch
    waiting for approvals."""
    plot = client.submit(
        "Plot the first 20 Fibonacci numbers.",
        model=write_replay(directory, "plot.jsonl", PLOT),
        approval="auto",
    )
    for demo in json.loads((EXAMPLES / "demo.json").read_text()):
        model = f"replay:{shutil.copy(EXAMPLES / demo['replay'], directory)}"
        session_id = None
        for prompt in demo["prompts"]:
            handle = client.submit(prompt, model=model, session_id=session_id, approval="auto")
            client.wait(handle, timeout=120)
            session_id = handle.session_id
    client.wait(plot, timeout=120)
    items = [
        json.loads(line) for line in (EXAMPLES / "batch" / "items.jsonl").read_text().splitlines()
    ]
    shutil.copytree(EXAMPLES / "batch" / "replays", directory / "replays")
    done = client.submit_batch(
        write_items(directory / "arithmetic.jsonl", items[:8]), model="replay:none", concurrency=4
    )
    done.wait(timeout=180)
    review = client.submit_batch(
        write_items(directory / "review.jsonl", items[8:11]), model="replay:none", approval="ask"
    )
    wait_for(lambda: review.progress().parked == 3, 60, "3 batch items waiting for approval")
    waiting = client.submit(
        "Clean up the scratch files older than a week.",
        model=write_replay(directory, "cleanup.jsonl", CLEANUP),
        approval="ask",
    )
    wait_for(lambda: client.pending(waiting.session_id), 60, "the approval request")
    return plot.session_id, review.id


def main(out: Path) -> None:
    fleet = Fleet(prefix="actfleet-demo-", deadline=600)
    fleet.start_redis()
    fleet.start_worker("node-1", warm_kernels=2)
    fleet.start_worker("node-2", warm_kernels=2)
    client = Client(fleet.redis_url)
    session_id, batch_id = run_sessions(client, fleet.dir)
    url = start_dashboard(fleet)
    out.mkdir(parents=True, exist_ok=True)
    pages = [
        ("fleet", "/", "table"),
        ("sessions", "/sessions", "table a.mono"),
        ("session", f"/sessions/{session_id}", ".event.TurnFinished"),
        ("approvals", "/approvals", ".request"),
        ("batches", "/batches", "table a.mono"),
        ("batch", f"/batches/{batch_id}", "#waiting .request"),
    ]
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        for name, path, ready in pages:
            page.goto(url + path)
            page.wait_for_selector(ready, timeout=30_000)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=out / f"{name}.png", full_page=True)
            print(out / f"{name}.png")
        browser.close()
    fleet.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    main(parser.parse_args().out)
