#!/usr/bin/env bash
# A separate virtual environment for the MKLpy peer (benchmarks/peers/run_mklpy.py), so that torch
# never enters mklscale's environment.  Idempotent: re-running only checks the installed versions.
#
#   bash benchmarks/peers/setup_mklpy_venv.sh [VENV]      # default: benchmarks/peers/.venv (git-ignored: .venv/)
#
# Pins: torch 2.13.0, CPU build (the "+cpu" wheel from /opt/wheels or the PyTorch CPU index when
# reachable, else plain PyPI torch==2.13.0), MKLpy 0.6 and the numpy / scikit-learn it needs.
# Prints the installed versions as one JSON line at the end (bench_peers.py records it).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${1:-${MKLPY_VENV:-$HERE/.venv}}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
MKLPY_VERSION="${MKLPY_VERSION:-0.6}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

have() {  # have PACKAGE VERSION-PREFIX
    "$VPY" - "$1" "$2" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version(sys.argv[1]).startswith(sys.argv[2]) else 1)
PYEOF
}

if ! have torch "$TORCH_VERSION"; then
    "$VPY" -m pip install --quiet --upgrade pip wheel setuptools || true
    # 1. the CPU wheel (no CUDA libraries): a local wheel directory or the PyTorch CPU index
    "$VPY" -m pip install --quiet "torch==${TORCH_VERSION}+cpu" \
        || "$VPY" -m pip install --quiet "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu \
        || "$VPY" -m pip install --quiet "torch==${TORCH_VERSION}"     # 2. plain PyPI (pulls the CUDA wheels)
fi
if ! have MKLpy "$MKLPY_VERSION"; then
    # MKLpy's own requirements (torch, numpy, scikit-learn, cvxopt) without letting pip replace torch
    "$VPY" -m pip install --quiet "MKLpy==${MKLPY_VERSION}" "torch==$("$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
        numpy scikit-learn scipy cvxopt psutil
fi

"$VPY" - <<'PYEOF'
import json, platform
from importlib.metadata import version
out = {"python": platform.python_version()}
for name in ("torch", "MKLpy", "numpy", "scikit-learn", "scipy", "cvxopt", "psutil"):
    try:
        out[name] = version(name)
    except Exception as exc:  # noqa: BLE001
        out[name] = f"missing ({exc})"
import MKLpy, MKLpy.algorithms  # noqa: F401,E401  (fails loudly if the combination does not import)
out["import_ok"] = True
print(json.dumps(out))
PYEOF
