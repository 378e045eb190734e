#!/usr/bin/env bash
# The one-shot GPU check of issues 24 and 32 (details: benchmarks/gpu_check.py, docs/PERFORMANCE.md).
#
#   benchmarks/gpu_check.sh [--wheels DIR] [--dry-run] [OUT_DIR]     # default OUT_DIR: runs/gpu_check
#
# Where the machine's python3 (or $PYTHON) already has a CUDA torch and triton (a cluster node, a
# cloud or NGC image), the check uses them: it creates .venv-gpu with --system-site-packages (the
# machine's torch, triton and whatever else it has stay visible) and installs only what is missing
# there: with --wheels DIR from a wheel folder made beforehand by `scripts/gpu_wheels.sh DIR`
# (pip --no-index: no network needed), without --wheels from the package index. The project itself
# is used from the checkout (PYTHONPATH), not installed.
# Otherwise, on a bare machine with one NVIDIA GPU and an index: creates .venv-gpu, installs a CUDA
# torch from PyPI (a few GB) and the project into it.
# Then runs the CUDA tests and the measurements within the rest of an 8-minute budget and writes
# OUT_DIR/report.md (+ report.json). --dry-run prints the plan (python, torch, where each package
# comes from) and stops. GPU_CHECK_PYTHON=/path/to/python skips the setup and uses an environment
# that already has everything. GPU_CHECK_SECONDS (default 480) is the whole budget.
# Exit code 2: no CUDA device, or a setup that cannot work (one line says why).
set -euo pipefail
START=$(date +%s)
TOTAL=${GPU_CHECK_SECONDS:-480}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=""; DRY=0; OUT=""
while (( $# )); do
    case $1 in
        --wheels) [[ $# -ge 2 ]] || { echo "gpu_check: --wheels needs a folder" >&2; exit 2; }; WHEELS=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu_check: unknown option $1 (expected --wheels DIR, --dry-run, OUT_DIR)" >&2; exit 2 ;;
        *) [[ -z $OUT ]] || { echo "gpu_check: one OUT_DIR only, got $OUT and $1" >&2; exit 2; }; OUT=$1; shift ;;
    esac
done
OUT=${OUT:-$REPO/runs/gpu_check}
if [[ -n $WHEELS ]]; then  # resolved from the caller's folder, before the cd into the checkout
    [[ -d $WHEELS ]] || { echo "gpu_check: --wheels $WHEELS: no such folder (make it with scripts/gpu_wheels.sh DIR)" >&2; exit 2; }
    WHEELS=$(cd "$WHEELS" && pwd)
    compgen -G "$WHEELS/*.whl" >/dev/null || { echo "gpu_check: --wheels $WHEELS holds no .whl files (scripts/gpu_wheels.sh DIR makes them)" >&2; exit 2; }
fi
cd "$REPO"
# the packages the check needs beyond torch and triton: one list, shared with the wheel script
mapfile -t REQUIREMENTS < <(bash "$REPO/scripts/gpu_wheels.sh" --list)
NO_DEPS_REQ=() ; WITH_DEPS_REQ=()
for req in "${REQUIREMENTS[@]}"; do
    if [[ $req == ve-fairseq* ]]; then NO_DEPS_REQ+=("$req"); else WITH_DEPS_REQ+=("$req"); fi
done

PYTHON=${PYTHON:-python3}
VENV=$REPO/.venv-gpu
# does this python have a CUDA torch and triton? prints "torch VERSION cuda VERSION|none triton VERSION|none"
probe() {
    "$1" - <<'EOF' 2>/dev/null || echo "torch none cuda none triton none"
import importlib.util
try:
    import torch
    t, c = torch.__version__, (torch.version.cuda or "none")
except Exception:
    t = c = "none"
tr = "none"
if importlib.util.find_spec("triton") is not None:
    from importlib.metadata import version
    tr = version("triton")
print("torch", t, "cuda", c, "triton", tr)
EOF
}
# where each requirement would come from: the machine, the wheel folder, or (missing)
sources() {
    "$1" - "$WHEELS" "${REQUIREMENTS[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
try:
    from packaging.requirements import Requirement
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement
folder, reqs = sys.argv[1], sys.argv[2:]
wheels = {p.name.split("-")[0].lower(): p for p in Path(folder).glob("*.whl")} if folder else {}
for req in map(Requirement, reqs):
    have = ""
    try:
        have = version(req.name)
        if req.specifier.contains(have, prereleases=True):
            print(f"  {str(req):30s} the machine's {req.name} {have}")
            continue
        have = f" (the machine's {have} does not fit)"
    except PackageNotFoundError:
        pass
    wheel = wheels.get(req.name.lower().replace("-", "_"))
    where = wheel.name if wheel else "the package index" if not folder else "MISSING: neither on the machine nor in the folder"
    print(f"  {str(req):30s} {where}{have}")
if folder:
    size = sum(p.stat().st_size for p in Path(folder).glob("*.whl"))
    print(f"  wheel folder: {len(list(Path(folder).glob('*.whl')))} wheels, {size / 2**20:.1f} MiB "
          "(their own dependencies resolve against the machine first, then the folder)")
EOF
}
# pip's own verdict on installing from the folder into this python (dependencies included, against
# what the machine has): one line
resolves() {
    local pyver out
    pyver=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ $pyver != 3.12 ]]; then
        echo "  pip --dry-run --no-index: not tried (the folder holds CPython 3.12 wheels; this python is $pyver)"
        return
    fi
    if out=$("$1" -m pip install --dry-run --no-index --find-links "$WHEELS" --disable-pip-version-check \
                 "${WITH_DEPS_REQ[@]}" 2>&1); then
        local count  # "Would install a-1 b-2 ...": the words after the first two
        count=$(grep -o 'Would install.*' <<< "$out" | wc -w)
        echo "  pip --dry-run --no-index: resolves; $(( count > 2 ? count - 2 : 0 )) packages from the folder, the rest the machine's"
    else
        echo "  pip --dry-run --no-index: FAILS: $(grep -m1 '^ERROR' <<< "$out" || tail -1 <<< "$out")"
    fi
}

if [[ -n ${GPU_CHECK_PYTHON:-} ]]; then
    MODE=given
    PY=$GPU_CHECK_PYTHON
else
    read -r _ TORCH _ CUDA _ TRITON <<< "$(probe "$PYTHON")"
    if [[ $TORCH != none && $CUDA != none && $TRITON != none ]]; then MODE=machine; else MODE=bare; fi
fi

if (( DRY )); then
    echo "gpu_check --dry-run: the plan (nothing is installed or run)"
    echo "  checkout: $REPO; report: $OUT; budget: ${TOTAL} s"
    case $MODE in
        given) echo "  python: GPU_CHECK_PYTHON=$PY, used as it is (no setup)" ;;
        machine|bare)
            echo "  python: $PYTHON ($(command -v "$PYTHON" || echo "not found")): torch $TORCH (CUDA $CUDA), triton $TRITON"
            if [[ $MODE == machine ]]; then
                echo "  setup: $VENV with --system-site-packages (the machine's torch $TORCH and triton $TRITON), the project from the checkout"
                if [[ -n $WHEELS ]]; then
                    echo "  install: pip install --no-index --find-links $WHEELS (--no-deps for ${NO_DEPS_REQ[*]})"
                else
                    echo "  install: from the package index (pip; --no-deps for ${NO_DEPS_REQ[*]})"
                fi
                echo "  packages:"
                sources "$PYTHON"
                [[ -z $WHEELS ]] || resolves "$PYTHON"
            else
                echo "  this python has no CUDA torch with triton: the run would need an NVIDIA GPU and the package index"
                echo "  (a CUDA torch from PyPI into $VENV, then the project)$([[ -n $WHEELS ]] && echo "; with --wheels it stops here (exit 2)")"
                if [[ -n $WHEELS ]]; then
                    echo "  packages (what the wheel folder holds, for a machine with a CUDA torch):"; sources "$PYTHON"; resolves "$PYTHON"
                fi
            fi ;;
    esac
    echo "  then: python benchmarks/gpu_check.py --out $OUT --budget-s (the rest of ${TOTAL} s)"
    exit 0
fi

case $MODE in
    given)
        echo "gpu_check: using $PY (no setup)" ;;
    machine)
        echo "gpu_check: using $PYTHON's torch $TORCH (CUDA $CUDA) and triton $TRITON"
        if [[ ! -x $VENV/bin/python ]]; then
            # --without-pip: no ensurepip needed; the machine's pip (visible through the system site) installs into the venv
            "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
        fi
        PY=$VENV/bin/python
        "$PY" -m pip --version >/dev/null 2>&1 || { echo "gpu_check: $PYTHON has no pip to install the project's requirements" >&2; exit 2; }
        if [[ -n $WHEELS ]]; then
            echo "gpu_check: installing what the machine lacks from $WHEELS (pip --no-index)"
            FROM=(--no-index --find-links "$WHEELS")
        else
            echo "gpu_check: installing what the machine lacks from the package index (pip, quiet)"
            FROM=()
        fi
        "$PY" -m pip install -q --disable-pip-version-check "${FROM[@]}" --no-deps "${NO_DEPS_REQ[@]}"
        "$PY" -m pip install -q --disable-pip-version-check "${FROM[@]}" "${WITH_DEPS_REQ[@]}"
        export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} ;;
    bare)
        if [[ -n $WHEELS ]]; then
            echo "gpu_check: --wheels needs a python with a CUDA torch and triton; $PYTHON has torch $TORCH (CUDA $CUDA)," \
                 "triton $TRITON (set PYTHON=/path/to/python3)" >&2
            exit 2
        fi
        # stop before downloading gigabytes where no GPU can run them
        if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
            echo "gpu_check: no NVIDIA GPU found (nvidia-smi missing or failing); this check needs one." \
                 "Set GPU_CHECK_PYTHON to run its CPU preflight in an existing environment." >&2
            exit 2
        fi
        nvidia-smi -L
        if [[ ! -x $VENV/bin/python ]]; then
            echo "gpu_check: creating $VENV"
            "$PYTHON" -m venv "$VENV"
        fi
        PY=$VENV/bin/python
        echo "gpu_check: installing a CUDA torch from PyPI and the project (pip, quiet)"
        "$PY" -m pip install -q --upgrade pip
        # PyPI's default Linux torch wheel is the CUDA build; it brings its own matching triton
        "$PY" -m pip install -q "torch>=2.5" pytest
        "$PY" -m pip install -q -e . ;;
esac

"$PY" -c "import torch, reluformer_mt, triton; print('gpu_check: torch', torch.__version__, 'CUDA', torch.version.cuda, '| triton', triton.__version__)"
ELAPSED=$(( $(date +%s) - START ))
# keep ~30 s for starting Python, building models before the budget clock and writing the report
BUDGET=$(( TOTAL - ELAPSED - 30 ))
if (( BUDGET < 60 )); then
    echo "gpu_check: setup took ${ELAPSED} s of ${TOTAL} s; measuring with 60 s anyway" >&2
    BUDGET=60
fi
exec "$PY" benchmarks/gpu_check.py --out "$OUT" --budget-s "$BUDGET"
