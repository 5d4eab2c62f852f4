"""The CLI stays light: `actfleet --help` imports no model, kernel or Celery code."""

from __future__ import annotations

import subprocess
import sys
import time

HEAVY = ("pydantic_ai", "jupyter_client", "ipykernel", "celery", "zmq", "openai", "bashlex")


def test_help_imports_no_model_kernel_or_celery_code():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "actfleet", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and "Commands" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
    assert not imported & set(HEAVY)


def test_help_returns_in_under_a_second():
    best = min(_timed([sys.executable, "-m", "actfleet", "--help"]) for _ in range(3))
    assert best < 1.0, f"actfleet --help took {best:.2f} s"


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, timeout=30)
    return time.perf_counter() - started
