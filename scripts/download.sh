#!/usr/bin/env bash
# Fetch the corpora (sha256-checked) or copy them from a local folder laid out like ../shared/data.
#   scripts/download.sh DEST [--local DIR] [docmt_ende] [iwslt17_ted_test] [bible] [discevalmt] [gold_align] [gold_align_deen] [contrapro]
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,3p' "$0"; exit 2; fi
dest=$1; shift
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"; [ -x "$py" ] || py=python3
exec "$py" -m reluformer_mt.data.download --dest "$dest" "$@"
