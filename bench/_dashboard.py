"""Shared parts of the dashboard scripts: `actfleet dashboard` as a process of a `Fleet`
(stopped with it), its CPU time and memory from /proc, and headless Chromium (Debian's
package) driven by Playwright.

Used as `from _dashboard import ...` by scripts run as `.venv/bin/python bench/<name>.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
from _fleet import ROOT, Fleet, free_port, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SEEN = """
window.seen = [];
new MutationObserver((records) => {
  for (const record of records)
    for (const node of record.addedNodes)
      if (node.classList && node.classList.contains("event"))
        window.seen.push({id: node.dataset.id, t: Date.now()});
}).observe(document, {childList: true, subtree: true});
"""
"""A page init script: when each event element appeared (ms since the epoch), in
`window.seen`."""


def start_dashboard(fleet: Fleet, name: str = "dashboard") -> str:
    """Start `python -m actfleet dashboard` on a free loopback port (no login there);
    returns its URL once it answers."""
    port = free_port()
    env = {**os.environ, "ACTFLEET_REDIS_URL": fleet.redis_url}
    log = open(fleet.log_path(name), "wb")  # noqa: SIM115 - lives with the process
    fleet.procs[name] = subprocess.Popen(
        [sys.executable, "-m", "actfleet", "dashboard", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if fleet.procs[name].poll() is not None:
            raise RuntimeError(f"the dashboard exited:\n{fleet.log(name)}")
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, 30, "the dashboard to answer")
    return url


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """The process's resident memory, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def launch_chromium(playwright):  # noqa: ANN001, ANN201 - Playwright's types
    """Headless Debian Chromium (Playwright's own browser download is not used)."""
    if not Path(CHROMIUM).exists():
        raise SystemExit("no Chromium: apt-get install chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
