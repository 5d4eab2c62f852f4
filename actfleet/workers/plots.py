"""Plots in kernels: matplotlib draws inline (PNG display data, kept as the cell's images)
from a font list built once per node.

matplotlib builds its font list on its first import in a fresh cache directory: that runs
`fc-list`, which the kernel's subprocess guard refuses, and takes seconds a cell's first
plot should not pay. A sandboxed kernel's cache would be its private /tmp, new with every
kernel. So the node builds the list once, outside any kernel, and each kernel gets a copy in
a config directory of its own (`MPLCONFIGDIR`, writable in the sandbox, gone with it). The
node keeps the list in memory: a node user without a writable home gets a cache directory
from matplotlib that is removed when the build exits.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ("INLINE_BACKEND", "font_list", "matplotlib_env")

logger = logging.getLogger(__name__)

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
"""ipykernel's inline backend: a figure shown (or left open at the end of a cell) is sent
as display data."""
CONFIG_DIR = "matplotlib"
"""The kernel's matplotlib config and cache directory, in its private directory."""
_BUILD = (
    "import json, pathlib, matplotlib, matplotlib.font_manager as fm; "
    "path = pathlib.Path(matplotlib.get_cachedir(), "
    "f'fontlist-v{fm.FontManager.__version__}.json'); "
    "print(json.dumps([path.name, path.read_text()]))"
)
_BUILD_TIMEOUT = 300.0
_lock = threading.Lock()
_built: list[tuple[str, str] | None] = []


def font_list() -> tuple[str, str] | None:
    """This interpreter's matplotlib font list (file name, content), built in the node
    user's matplotlib cache if missing; once per process. `None` when it cannot be had (no
    matplotlib): kernels then plot without a copy, or fail to import matplotlib as they
    would anyway."""
    with _lock:
        if not _built:
            _built.append(_build())
        return _built[0]


def _build() -> tuple[str, str] | None:
    try:
        result = subprocess.run(
            [sys.executable, "-c", _BUILD],
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT,
            env={**os.environ, "MPLBACKEND": "agg"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("matplotlib's font list was not built (%s); kernels plot without it", exc)
        return None
    try:
        name, content = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        name = content = ""
    if result.returncode != 0 or not name:
        reason = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
        logger.warning("matplotlib's font list was not built (%s)", reason[0])
        return None
    return name, content


def matplotlib_env(kernel_dir: Path, uid: int | None) -> dict[str, str]:
    """The environment a kernel plots with: the inline backend, and a config directory in
    `kernel_dir` holding a copy of the node's font list (owned by `uid` when given)."""
    config = kernel_dir / CONFIG_DIR
    config.mkdir(exist_ok=True)
    fonts = font_list()
    if fonts is not None:
        (config / fonts[0]).write_text(fonts[1])
    if uid is not None:
        for path in (config, *config.iterdir()):
            os.chown(path, uid, uid)
    return {"MPLBACKEND": INLINE_BACKEND, "MPLCONFIGDIR": str(config)}
