"""The CLI stays light: `actfleet --help` imports no model, kernel or Celery code (its start-up
time is measured by bench/cli_startup.py, not asserted here)."""

from __future__ import annotations

import subprocess
import sys

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
