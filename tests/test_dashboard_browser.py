"""The dashboard in headless Chromium (Debian's package, driven by Playwright): a session
page opened before its turn shows every event in order, each within 1 s of its commit, a
matplotlib plot among them, and after the dashboard is killed and restarted mid-turn it has
no duplicate and no gap; approving from the page resumes the turn; a batch page approves its
batch and follows it live to its end. Screenshots of the pages go to /tmp for a person to
look at."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from actfleet.client import Client
from actfleet.dashboard.render import CHUNKS
from tests.conftest import wait_for, write_replay
from tests.test_batches import one_cell, write_items
from tests.test_dashboard import served  # noqa: F401 - the fixture

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")
if not Path(CHROMIUM).exists():
    pytest.skip("no Chromium: apt-get install chromium", allow_module_level=True)

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
SEEN = """
window.seen = [];
new MutationObserver((records) => {
  for (const record of records)
    for (const node of record.addedNodes)
      if (node.classList && node.classList.contains("event"))
        window.seen.push({id: node.dataset.id, t: Date.now()});
}).observe(document, {childList: true, subtree: true});
"""
"""Records when each event element appeared in the page (ms since the epoch)."""
VISIBILITY = """(hidden) => {
  Object.defineProperty(document, "hidden", {value: hidden, configurable: true});
  document.dispatchEvent(new Event("visibilitychange"));
}"""
"""Hides or shows the page as switching tabs does (headless pages are always visible)."""


def alices_page(playwright: Any) -> Any:
    """A page of headless Chromium (Debian's) logged in as alice."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    context = browser.new_context(
        http_credentials={"username": "alice", "password": "wonderland"},
        viewport={"width": 1100, "height": 900},
    )
    return context.new_page()


class DashboardProcess:
    """`actfleet dashboard` as a user runs it (basic auth alice / bob), on a fixed port so
    that it can be killed and started again under the page's feet."""

    def __init__(self, redis_url: str, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.redis_url, self.log = redis_url, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "ACTFLEET_REDIS_URL": self.redis_url,
            "ACTFLEET_DASHBOARD_BASIC_AUTH": "alice:wonderland,bob:builder",
        }
        cmd = [sys.executable, "-m", "actfleet", "dashboard", "--port", str(self.port)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._answers, 30, "the dashboard to answer")

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"the dashboard exited:\n{self.log.read_text()[-3000:]}")
        try:
            return httpx.get(self.url, auth=("alice", "wonderland")).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def dashboard(redis_url: str, tmp_path: Path) -> Iterator[DashboardProcess]:
    process = DashboardProcess(redis_url, tmp_path / "dashboard.log")
    process.start()
    yield process
    process.kill()


def test_a_session_page_opened_before_the_turn_shows_it_live_and_survives_a_restart(
    dashboard: DashboardProcess, redis_url: str, fleet_factory, tmp_path: Path
) -> None:
    """Two cells under `ask`: the first (a matplotlib plot) is approved from the page; the
    dashboard is then SIGKILLed, the second is approved from the SDK and the turn ends while
    it is down; restarted, the page resumes from its Last-Event-ID. The page's events are
    the stream's, in order, none twice; each that was committed while the page was
    connected appeared within 1 s. Hidden, the page lets go of its stream; a turn that runs
    meanwhile shows up once the page is shown again, with no gap and none twice."""
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"text": "A plot first.", "code": PLOT},
        {"code": "print('after the restart')"},
        {"text": "A **line** was drawn."},
        {"text": "Answered while the tab was hidden."},
    )
    client = Client(redis_url)
    session_id = "s-browser-live"
    with sync_api.sync_playwright() as p:
        page = alices_page(p)
        page.add_init_script(SEEN)
        page.goto(f"{dashboard.url}/sessions/{session_id}")
        page.wait_for_selector("#connection.ok")
        handle = client.submit(
            "draw a line", model=f"replay:{replay}", session_id=session_id, approval="ask"
        )
        page.click(".approval .decide button:has-text('Approve')", timeout=60_000)
        page.wait_for_selector(".event.CodeExecutionOutput img.cell-image", timeout=60_000)
        page.wait_for_function(
            "document.querySelector('img.cell-image').naturalWidth > 100", timeout=10_000
        )
        (second,) = wait_for(lambda: client.pending(session_id), 60, "the second request")
        page.wait_for_selector(f"#approval-{second.id}")
        killed_at = page.evaluate("Date.now()")
        dashboard.kill()
        page.wait_for_selector("#connection.warn")
        client.approve(second.id, args_sha256=second.args_sha256, approver="carol")
        wait_for(lambda: client.result(handle.turn_id), 60, "the turn to end")
        dashboard.start()
        page.wait_for_selector(".event.TurnFinished", timeout=30_000)
        assert page.locator("#connection").inner_text() == "live"
        assert "approved by alice" in page.locator(".event.ApprovalDecision").first.inner_text()
        assert "line</strong> was drawn" in page.locator(".event.Response").last.inner_html()
        seen = page.evaluate("window.seen")
        # A hidden tab closes its stream; shown again, it resumes after its last event.
        page.evaluate(VISIBILITY, True)
        page.wait_for_selector("#connection:has-text('paused while hidden')")
        hidden = client.submit("again", model=f"replay:{replay}", session_id=session_id)
        wait_for(lambda: client.result(hidden.turn_id), 60, "the turn run while hidden")
        page.evaluate(VISIBILITY, False)
        page.wait_for_selector(".event.TurnFinished >> nth=1", timeout=30_000)
        on_page = page.eval_on_selector_all("#events .event", "els => els.map(e => e.dataset.id)")
        page.screenshot(path="/tmp/actfleet-dashboard-session.png", full_page=True)
        page.context.browser.close()
    assert client.result(handle.turn_id).status == "finished"
    stream = [e for e in client.events(session_id, follow=False) if not isinstance(e, CHUNKS)]
    assert on_page == [e.id for e in stream]
    committed = {e.id: int(e.id.split("-")[0]) for e in stream}
    lags = {s["id"]: s["t"] - committed[s["id"]] for s in seen if committed[s["id"]] < killed_at}
    assert len(lags) >= 5, seen
    assert max(lags.values()) < 1000, lags


def test_batch_page_approves_the_batch_and_follows_it_to_its_end(
    served: str,  # noqa: F811
    redis_url: str,
    fleet_factory,
    tmp_path: Path,
) -> None:
    fleet = fleet_factory(redis_url)
    fleet.start("n1", "--kernels", "4")
    client = Client(redis_url)
    batch = client.submit_batch(
        write_items(tmp_path / "ask.jsonl", 3),
        model=f"replay:{one_cell(tmp_path)}",
        concurrency=3,
        approval="ask",
    )
    wait_for(lambda: batch.progress().parked == 3, 60, "3 items parked")
    with sync_api.sync_playwright() as p:
        page = alices_page(p)
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(f"{served}/batches/{batch.id}")
        page.wait_for_selector("#connection.ok")
        page.screenshot(path="/tmp/actfleet-dashboard-batch-waiting.png", full_page=True)
        page.click("button:has-text('Approve all of this batch')")
        page.wait_for_selector("#connection:has-text('ended')", timeout=60_000)
        assert page.locator("#decision-log").inner_text().count("approved by alice") == 3
        assert "3 / 3 ended" in page.locator("#progress").inner_text()
        assert page.locator("#waiting").inner_text().strip() == ""
        assert page.locator("#cancel-batch").count() == 0
        page.screenshot(path="/tmp/actfleet-dashboard-batch.png", full_page=True)
        page.goto(f"{served}/batches")
        page.screenshot(path="/tmp/actfleet-dashboard-batches.png", full_page=True)
        page.context.browser.close()
    assert batch.progress().record.counts["completed"] == 3
