#!/usr/bin/env bash
# Wheels for the GPU check on an offline machine (issue 32): run this where pip reaches an index,
# copy DIR to the GPU machine, then run `benchmarks/gpu_check.sh --wheels DIR` there.
#
#   scripts/gpu_wheels.sh DIR [--have FILE] [--skip numpy,scipy] [--list]
#
# Downloads Python 3.12 manylinux x86_64 wheels of what the check imports and a stock CUDA image
# (Python 3.12 with a CUDA torch and its triton) lacks: the list below, with their dependencies.
# Never torch, triton or torch's own requirements (the machine's CUDA build is the one to test),
# and nothing the check does not import (faiss, eflomal, sentencepiece, matplotlib, ...).
# --have FILE (`python3 -m pip list --format=freeze > FILE` run on the GPU machine) drops every wheel
# whose package the machine already has at a version that fits (scripts/gpu_wheels_have.py): the
# folder then holds exactly what that machine lacks. --skip drops packages by name without checking
# versions (NGC's PyTorch images ship numpy and scipy: --skip numpy,scipy). --list prints the
# requirement list and stops. Prints each wheel and the total.
set -euo pipefail

# What benchmarks/gpu_check.py and tests/test_triton_kernel.py import beyond torch and triton
# (tests/test_gpu_wheels.py checks this against their imports):
#   ve-fairseq (the models; installed without its requirements: torchaudio, cython, cffi are not
#   imported), its imports hydra-core, omegaconf, bitarray, sacrebleu, scikit-learn (fairseq.tasks
#   imports it: scipy comes with it), numpy (below 2.5: the check and the kernel's tests ran with
#   2.2.6 and 2.4.6; wider than the project's CPU pin so that a machine's numpy 2.3/2.4 serves);
#   tqdm; pytest for section 1.
REQUIREMENTS=(
    "ve-fairseq==0.12.3"
    "hydra-core>=1.0.7,<1.4"
    "omegaconf<2.4"
    "bitarray"
    "sacrebleu>=2.3,<3"
    "scikit-learn>=1.3"
    "numpy<2.5"
    "tqdm"
    "pytest>=7"
)
# installed without dependencies (its metadata asks for torchaudio and build tools the check never imports)
NO_DEPS="ve-fairseq"
# antlr4-python3-runtime (hydra's parser) is published as an sdist only: built here as a pure-Python wheel
SDISTS=("antlr4-python3-runtime==4.9.3")

usage() { echo "usage: scripts/gpu_wheels.sh DIR [--have FILE] [--skip PKG,PKG] [--list]" >&2; exit 2; }
DIR=""; SKIP=""; HAVE=""; LIST=0
while (( $# )); do
    case $1 in
        --skip) [[ $# -ge 2 ]] || usage; SKIP=$2; shift 2 ;;
        --have) [[ $# -ge 2 ]] || usage; HAVE=$2; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu_wheels: unknown option $1" >&2; usage ;;
        *) [[ -z $DIR ]] || usage; DIR=$1; shift ;;
    esac
done
if (( LIST )); then printf '%s\n' "${REQUIREMENTS[@]}" "${SDISTS[@]}"; exit 0; fi
[[ -n $DIR ]] || usage
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip --version >/dev/null 2>&1 || { echo "gpu_wheels: $PYTHON has no pip" >&2; exit 2; }
HAVE_PY=$(dirname "$0")/gpu_wheels_have.py
[[ -z $HAVE ]] || "$PYTHON" "$HAVE_PY" "$HAVE"  # a bad file stops here, before any download
mkdir -p "$DIR"

skipped() {  # is the requirement's name in --skip?
    local name=${1%%[<>=!~ ]*}
    [[ ",${SKIP,,}," == *",${name,,},"* ]]
}
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64)
PIP=("$PYTHON" -m pip -q --disable-pip-version-check)

for req in "${SDISTS[@]}"; do
    "${PIP[@]}" wheel --no-deps --wheel-dir "$DIR" "$req"
done
WITH_DEPS=()
for req in "${REQUIREMENTS[@]}"; do
    skipped "$req" && continue
    if [[ ${req%%[<>=!~ ]*} == "$NO_DEPS" ]]; then
        "${PIP[@]}" download "${TARGET[@]}" --no-deps --dest "$DIR" "$req"
    else
        WITH_DEPS+=("$req")
    fi
done
# one resolution for the rest; the sdist-built wheels are found in DIR. Skipped packages are
# still resolved as dependencies (scikit-learn needs scipy) and deleted afterwards.
"${PIP[@]}" download "${TARGET[@]}" --find-links "$DIR" --dest "$DIR" "${WITH_DEPS[@]}"
if [[ -n $SKIP ]]; then
    IFS=, read -ra names <<< "$SKIP"
    for name in "${names[@]}"; do
        norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
        find "$DIR" -maxdepth 1 -iname "${norm}-*.whl" -print -delete | sed 's/^/gpu_wheels: skipped /'
    done
fi
if [[ -n $HAVE ]]; then
    "$PYTHON" "$HAVE_PY" "$HAVE" --prune "$DIR" --no-deps "$NO_DEPS" -- "${REQUIREMENTS[@]}" "${SDISTS[@]}"
fi
# never ship torch or triton (pulled in by nothing above, but keep the folder honest)
find "$DIR" -maxdepth 1 \( -name 'torch-*.whl' -o -name 'triton-*.whl' -o -name 'nvidia_*.whl' \) -print -delete \
    | sed 's/^/gpu_wheels: removed /'
ls -l "$DIR"/*.whl | awk '{printf "%8.1f MiB  %s\n", $5 / 1048576, $NF}'
du -cb "$DIR"/*.whl | tail -1 | awk '{printf "gpu_wheels: %.1f MiB in all\n", $1 / 1048576}'
