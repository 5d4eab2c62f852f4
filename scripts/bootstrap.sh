# Sourced by scripts/demo and scripts/test: makes .venv with actfleet installed and a
# redis-server on PATH, on a fresh Debian machine or a prepared one. Idempotent and quiet.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
    command -v apt-get >/dev/null || { echo "error: install $* with your package manager" >&2; exit 1; }
    [ -n "${_APT_UPDATED:-}" ] || { as_root apt-get update -qq; _APT_UPDATED=1; }
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null &&
           "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            PYTHON="$candidate"; break
        fi
    done
fi
[ -n "$PYTHON" ] || { apt_install python3 python3-venv; PYTHON=python3; }

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" 2>/dev/null || { apt_install python3-venv; rm -rf "$VENV"; "$PYTHON" -m venv "$VENV"; }
fi
stamp="$VENV/.actfleet-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "installing actfleet and its dependencies into .venv ..."
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -U pip
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]"
    touch "$stamp"
fi

command -v redis-server >/dev/null || { echo "installing redis-server ..."; apt_install redis-server; }
# Kernels run in a bubblewrap sandbox (docs/security.md); prlimit and setpriv are util-linux.
command -v bwrap >/dev/null || { echo "installing bubblewrap ..."; apt_install bubblewrap; }
export PATH="$VENV/bin:$PATH"
