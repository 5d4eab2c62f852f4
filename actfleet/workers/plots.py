"""Plots in kernels: matplotlib draws inline (PNG display data, kept as the cell's images)
from a font list built once per node.

matplotlib builds its font list on its first import in a fresh cache directory: that runs
`fc-list`, which the kernel's subprocess guard refuses, and takes seconds a cell's first
plot should not pay. A sandboxed kernel's cache would be its private /tmp, new with every
kernel. So the node builds the list once, outside any kernel, and each kernel gets a copy in
a config directory of its own (`MPLCONFIGDIR`, writable in the sandbox, gone with it).
"""

from __future__ import annotations

import logging
import os
import shutil
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
    "import pathlib, matplotlib, matplotlib.font_manager as fm; "
    "print(pathlib.Path(matplotlib.get_cachedir(), "
    "f'fontlist-v{fm.FontManager.__version__}.json'))"
)
_BUILD_TIMEOUT = 300.0
_lock = threading.Lock()
_built: list[Path | None] = []


def font_list() -> Path | None:
    """This interpreter's matplotlib font list, built in the node user's matplotlib cache if
    missing; once per process. `None` when it cannot be had (no matplotlib): kernels then
    plot without a copy, or fail to import matplotlib as they would anyway."""
    with _lock:
        if not _built:
            _built.append(_build())
        return _built[0]


def _build() -> Path | None:
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
    path = Path(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    if result.returncode != 0 or path is None or not path.is_file():
        reason = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
        logger.warning("matplotlib's font list was not built (%s)", reason[0])
        return None
    return path


def matplotlib_env(kernel_dir: Path, uid: int | None) -> dict[str, str]:
    """The environment a kernel plots with: the inline backend, and a config directory in
    `kernel_dir` holding a copy of the node's font list (owned by `uid` when given)."""
    config = kernel_dir / CONFIG_DIR
    config.mkdir(exist_ok=True)
    fonts = font_list()
    if fonts is not None:
        shutil.copyfile(fonts, config / fonts.name)
    if uid is not None:
        for path in (config, *config.iterdir()):
            os.chown(path, uid, uid)
    return {"MPLBACKEND": INLINE_BACKEND, "MPLCONFIGDIR": str(config)}
