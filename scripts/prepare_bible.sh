#!/usr/bin/env bash
# Prepare the bible-alignments corpus (SBLGNT Greek -> BSB English; chapters = documents, held-out
# chapters for valid/test, gold word links in OUT/{split}.gold.align) in one command.
#   scripts/prepare_bible.sh LEVEL OUT [reluformer-prepare options...]   LEVEL: sentence | N (e.g. 512)
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,5p' "$0"; exit 2; fi
level=$1; out=$2; shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"; [ -x "$py" ] || py=python3
exec "$py" -m reluformer_mt.cli.prepare --format bible --segment-tokens "$level" \
  --vocab-size "${VOCAB_SIZE:-8000}" --joined-dictionary --workers "${WORKERS:-2}" --out "$out" "$@"
