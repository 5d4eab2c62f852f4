"""The Lua scripts in `lua/`, loaded once and called by SHA (EVAL again after a Redis
restart empties its script cache). A script's first line may name the libraries it uses
(`-- uses: emit, open_request`); they are prepended from `<name>.lib.lua`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

_DIR = Path(__file__).with_name("lua")


class Script:
    """One script, its source with its libraries, and its SHA."""

    def __init__(self, name: str):
        source = (_DIR / f"{name}.lua").read_text()
        first = source.splitlines()[0]
        libs = first.removeprefix("-- uses:").split(",") if first.startswith("-- uses:") else []
        self.name = name
        self.source = "".join((_DIR / f"{lib.strip()}.lib.lua").read_text() for lib in libs)
        self.source += source
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def run(self, redis: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call it with a synchronous client."""
        try:
            return redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return redis.eval(self.source, len(keys), *keys, *args)

    async def arun(self, redis: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call it with an asyncio client."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await redis.eval(self.source, len(keys), *keys, *args)


@cache
def script(name: str) -> Script:
    return Script(name)
