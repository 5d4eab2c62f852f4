"""Shared parts of the bench scripts: a private redis-server on a free port (never the
machine's shared Redis on 6379), real `actfleet worker` processes, percentiles, and
teardown of everything started (also on Ctrl-C or an exception).

Used as `from _fleet import ...` by scripts run as `.venv/bin/python bench/<name>.py`
from the repo root (Python puts the script's directory first on sys.path).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll a state-proving predicate until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 10) - 1]


def _deadline_passed(*_: object) -> None:
    raise TimeoutError("bench deadline passed; stopping everything it started")


class Fleet:
    """A private redis-server and worker nodes; `stop()` (also run at exit) ends them all."""

    def __init__(self, prefix: str = "bench-", deadline: int = 180) -> None:
        """`deadline`: seconds after which the script is stopped (SIGALRM), so a stuck
        turn cannot leave it, or the processes it started, running."""
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.redis_url = ""
        atexit.register(self.stop)
        # SIGTERM would skip atexit; turn it into a normal exit so teardown runs.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        signal.signal(signal.SIGALRM, _deadline_passed)
        signal.alarm(deadline)

    def start_redis(self) -> str:
        """Start redis-server on a free port; returns its URL (db 0)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not on PATH (Debian: apt-get install redis-server)")
        port, password = free_port(), secrets.token_urlsafe(24)
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.dir), "--requirepass", password]
        self.procs["redis"] = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=port, password=password)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, 10, "redis-server to answer")
        client.close()
        self.redis_url = f"redis://:{password}@127.0.0.1:{port}/0"
        return self.redis_url

    def start_worker(
        self, name: str, *, warm_kernels: int = 2, loglevel: str = "WARNING", **env: str
    ) -> None:
        """Start `python -m actfleet worker --name NAME` and wait for its heartbeat key."""
        workdir = self.dir / "work"
        workdir.mkdir(exist_ok=True)
        full_env = {
            **os.environ,
            "ACTFLEET_REDIS_URL": self.redis_url,
            "ACTFLEET_WORKDIR": str(workdir),
            "ACTFLEET_WARM_KERNELS": str(warm_kernels),
            **env,
        }
        log = open(self.log_path(name), "wb")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "actfleet", "worker", "--name", name, "--loglevel", loglevel],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        client = redis.Redis.from_url(self.redis_url)

        def up() -> bool:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"worker {name} exited:\n{self.log(name)}")
            return bool(client.exists(f"actfleet:node:{name}"))

        wait_for(up, 60, f"worker {name} to come up")
        client.close()

    def wait_warm(self, name: str, kernels: int, timeout: float = 60) -> None:
        """Wait until the worker has `kernels` kernel processes (its children) and they are
        idle: no CPU time used by any of them over 0.3 s (start-up finished)."""

        def cpu_ticks() -> int | None:
            pids = subprocess.run(
                ["pgrep", "-f", "-P", str(self.procs[name].pid), "ipykernel_launcher"],
                capture_output=True,
                text=True,
            ).stdout.split()
            if len(pids) < kernels:
                return None
            total = 0
            for pid in pids:
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except FileNotFoundError:
                    return None
                total += int(fields[11]) + int(fields[12])  # utime + stime
            return total

        def quiet() -> bool:
            before = cpu_ticks()
            time.sleep(0.3)
            return before is not None and cpu_ticks() == before

        wait_for(quiet, timeout, f"{kernels} idle warm kernels on {name}")

    def log_path(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def log(self, name: str) -> str:
        return self.log_path(name).read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        """Drain the workers (SIGTERM), then stop redis; remove the temp dir."""
        workers = [(n, p) for n, p in self.procs.items() if n != "redis"]
        for _, proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        server = self.procs.get("redis")
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(10)
        self.procs.clear()
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
