#!/usr/bin/env bash
# ReLUFormer's FFN-as-memory experiment at CPU scale: relu / softmax / softmax_ln FFNs at 32..4096
# slots, a fixed budget each, on the IWSLT2017 en-de talks of ../shared/data; writes
# $OUT/results.md, results.json and sweep.png. Override with env vars, e.g. the reduced run:
#   SLOTS=32,256,1024,4096 MAX_UPDATE=150 OUT=runs/ffn_sweep_small scripts/sweep_ffn_memory.sh
# Extra fairseq-train options for every run go after --.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m reluformer_mt.cli.sweep \
  --out "${OUT:-runs/ffn_memory_sweep}" \
  --variants "${VARIANTS:-relu,softmax,softmax_ln}" \
  --slots "${SLOTS:-32,64,128,256,512,1024,2048,3072,4096}" \
  --max-update "${MAX_UPDATE:-2000}" \
  --arch "${ARCH:-softmax_tiny}" "$@"
