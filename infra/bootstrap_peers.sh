#!/usr/bin/env bash
# The peers' environment for benchmarks/peers: TRL, pinned in infra/requirements-peers.txt, on top of
# the main venv (a .pth file adds its site-packages after this venv's own), so both trainers run
# the same torch and transformers and nothing of TRL enters undertow's environments. Reused while
# the pins are unchanged. Run infra/bootstrap.sh first (or `bash infra/bootstrap.sh --peers`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNDERTOW_CACHE:-$HOME/.cache/undertow}
base=$cache/venv
venv=$cache/peers-venv
key=$(cat "$root/infra/requirements-peers.txt" | sha256sum | cut -c1-16)

[ -x "$base/bin/python" ] || { echo "no main venv at $base: run infra/bootstrap.sh first" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  python3 -m venv "$venv"
fi
site() { "$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
# addsitedir, not a bare path: the main venv's own .pth files (undertow's editable install) apply too.
echo "import site; site.addsitedir('$(site "$base")')" > "$(site "$venv")/undertow-main-venv.pth"
if [ "$(cat "$venv/.undertow-deps" 2>/dev/null)" != "$key" ]; then
  echo "installing the peers' environment into $venv" >&2
  "$venv/bin/pip" install -q -r "$root/infra/requirements-peers.txt" 2>&1 | grep -v "py-data-juicer" >&2 || true
  "$venv/bin/python" -c "import trl" || { echo "$venv does not import trl" >&2; exit 1; }
  echo "$key" > "$venv/.undertow-deps"
fi
echo "$venv"
