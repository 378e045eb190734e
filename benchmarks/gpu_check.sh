#!/usr/bin/env bash
# The one-shot GPU check of issue 24 (details: benchmarks/gpu_check.py, docs/PERFORMANCE.md).
#
#   benchmarks/gpu_check.sh [OUT_DIR]          # default OUT_DIR: runs/gpu_check
#
# On a bare Linux machine with one NVIDIA GPU and Python >= 3.10: creates .venv-gpu in the checkout,
# installs a CUDA torch from PyPI and the project into it (a few GB, typically 1-3 minutes), then
# runs the CUDA tests and the measurements within the rest of an 8-minute budget and writes
# OUT_DIR/report.md (+ report.json). GPU_CHECK_PYTHON=/path/to/python skips the setup and uses an
# environment that already has the project (and, for the measurements, a CUDA torch).
# GPU_CHECK_SECONDS (default 480) is the whole budget. Exit code 2: no CUDA device.
set -euo pipefail
START=$(date +%s)
TOTAL=${GPU_CHECK_SECONDS:-480}
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$REPO/runs/gpu_check}
cd "$REPO"

if [[ -n "${GPU_CHECK_PYTHON:-}" ]]; then
    PY=$GPU_CHECK_PYTHON
    echo "gpu_check: using $PY (no setup)"
else
    # stop before downloading gigabytes where no GPU can run them
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no NVIDIA GPU found (nvidia-smi missing or failing); this check needs one." \
             "Set GPU_CHECK_PYTHON to run its CPU preflight in an existing environment." >&2
        exit 2
    fi
    nvidia-smi -L
    PYTHON=${PYTHON:-python3}
    VENV=$REPO/.venv-gpu
    if [[ ! -x $VENV/bin/python ]]; then
        echo "gpu_check: creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    PY=$VENV/bin/python
    echo "gpu_check: installing a CUDA torch from PyPI and the project (pip, quiet)"
    "$PY" -m pip install -q --upgrade pip
    # PyPI's default Linux torch wheel is the CUDA build; it brings its own matching triton
    "$PY" -m pip install -q "torch>=2.5" pytest
    "$PY" -m pip install -q -e .
fi

"$PY" -c "import torch, reluformer_mt, triton; print('gpu_check: torch', torch.__version__, 'CUDA', torch.version.cuda, '| triton', triton.__version__)"
ELAPSED=$(( $(date +%s) - START ))
# keep ~30 s for starting Python, building models before the budget clock and writing the report
BUDGET=$(( TOTAL - ELAPSED - 30 ))
if (( BUDGET < 60 )); then
    echo "gpu_check: setup took ${ELAPSED} s of ${TOTAL} s; measuring with 60 s anyway" >&2
    BUDGET=60
fi
exec "$PY" benchmarks/gpu_check.py --out "$OUT" --budget-s "$BUDGET"
