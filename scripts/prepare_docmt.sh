#!/usr/bin/env bash
# Prepare a Maruf et al. (2019) en->de document corpus (TED / News Commentary / Europarl) in one command.
#   scripts/prepare_docmt.sh CORPUS LEVEL OUT [reluformer-prepare options...]
#   CORPUS: IWSLT2017 (TED) | NC-2016 (News) | Europarl7;  LEVEL: sentence | N (segment tokens, e.g. 512)
# Data: $DOCMT_DIR (default ../shared/data/docmt_ende beside the checkout; scripts/download.sh fetches it).
# With concatenated_en2de_train_*.txt present: train = train, valid = dev, test = test. Without (the
# public repository has only dev/test): train = dev minus its last $VALID_DOCS documents, which become valid.
set -euo pipefail
if [ $# -lt 3 ]; then sed -n '2,8p' "$0"; exit 2; fi
corpus=$1; level=$2; out=$3; shift 3
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"; [ -x "$py" ] || py=python3
dir="${DOCMT_DIR:-$root/../shared/data/docmt_ende}/$corpus"
f() { echo "$dir/concatenated_en2de_$1_$2.txt"; }
[ -d "$dir" ] || { echo "prepare_docmt.sh: $dir not found (corpus one of IWSLT2017, NC-2016, Europarl7; set DOCMT_DIR)" >&2; exit 2; }
if [ -f "$(f train en)" ]; then
  splits=(--train "$(f train en)" "$(f train de)" --valid "$(f dev en)" "$(f dev de)")
else
  echo "prepare_docmt.sh: no training set in $dir; training on dev minus ${VALID_DOCS:-10} held-out documents (valid)" >&2
  splits=(--train "$(f dev en)" "$(f dev de)" --valid-from-train "${VALID_DOCS:-10}")
fi
exec "$py" -m reluformer_mt.cli.prepare --format docmt --src en --tgt de "${splits[@]}" \
  --test "$(f test en)" "$(f test de)" --segment-tokens "$level" --vocab-size "${VOCAB_SIZE:-8000}" \
  --joined-dictionary --workers "${WORKERS:-2}" --out "$out" "$@"
