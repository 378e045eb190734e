"""Peak memory of translating with a large TMX memory against the same translation without one.

Writes a TMX 1.4b file of ``--units`` translation units built from the real en-de sentence pairs
of ``docmt_ende`` (../shared/data: TED, News Commentary, Europarl dev and test sets, 25,127
pairs): the pairs themselves first, then pairs of two consecutive real sentences joined (so every
unit is distinct and its n-grams are real text's, as in a translation memory of that size).
Then runs ``reluformer-translate`` (once unmeasured with a 50-entry memory, to build the fused kernels) in fresh processes under ``/usr/bin/time -v``, once with
``--memory none`` (the baseline: torch, fairseq and the model) and once with ``--memory FILE.tmx``
per ``--match-score``, and prints a line per score: units, file size, the baseline's and the run's
maximum resident set size (what the operating system reports) and the memory's extra peak (their
difference) with the run's wall time.

    .venv/bin/python benchmarks/tmx_translation.py --checkpoint CKPT --units 61000 --input in.en \
        --match-score bm25-chars words

``CKPT`` is a checkpoint trained with ``--tm-fusion`` (on en-de SentencePiece data): it reads the
memory's matches; the input is a few source sentences (one a line).
"""
import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parents[1]
DOCMT = REPO.parent / "shared" / "data" / "docmt_ende"


def corpus_pairs(root: Path = DOCMT) -> list:
    """The (en, de) sentence pairs of every docmt_ende file pair, in file order (document marks,
    empty lines and carriage returns left out)."""
    pairs = []
    for en in sorted(root.glob("*/concatenated_en2de_*_en.txt")):
        de = en.with_name(en.name.replace("_en.txt", "_de.txt"))
        with open(en, encoding="utf-8") as fe, open(de, encoding="utf-8") as fd:
            for s, t in zip(fe, fd):
                s, t = s.strip(), t.strip()
                if s and t and s != "<d>":
                    pairs.append((s, t))
    if not pairs:
        raise SystemExit(f"tmx_translation: no sentence pairs under {root}")
    return pairs


def corpus_units(units: int, pairs: list):
    """``units`` distinct (en, de) units: every pair once, then two consecutive pairs joined, the
    second one further along each round."""
    n = len(pairs)
    for i in range(units):
        if i < n:
            yield pairs[i]
        else:
            step = i // n
            a, b = pairs[i % n], pairs[(i % n + step) % n]
            yield f"{a[0]} {b[0]}", f"{a[1]} {b[1]}"


def write_corpus_tmx(path: Path, units: int, root: Path = DOCMT) -> int:
    """Write the TMX of :func:`corpus_units`; returns its size in bytes."""
    with open(path, "w", encoding="utf-8") as f:
        f.write('<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header srclang="en" datatype="plaintext" '
                'segtype="sentence" adminlang="en" o-tmf="x" creationtool="bench" creationtoolversion="1"/>\n<body>\n')
        for i, (s, t) in enumerate(corpus_units(units, corpus_pairs(root))):
            f.write(f'<tu tuid="{i}"><tuv xml:lang="en-US"><seg>{escape(s)}</seg></tuv>'
                    f'<tuv xml:lang="de-DE"><seg>{escape(t)}</seg></tuv></tu>\n')
        f.write("</body></tmx>\n")
    return path.stat().st_size


def peak_rss_mib(argv: list) -> tuple:
    """(maximum resident set size in MiB, wall seconds) of ``argv`` run to the end under /usr/bin/time -v."""
    start = time.monotonic()
    run = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"tmx_translation: {' '.join(argv)} failed:\n{run.stderr[-2000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1)) / 1024
    return peak, time.monotonic() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--input", required=True, help="source sentences, one a line")
    parser.add_argument("--units", type=int, default=61_000, help="translation units (61,000: a 30 MB file)")
    parser.add_argument("--match-score", nargs="+", default=["bm25-chars"], metavar="SCORE",
                        help="the memory's match scores to measure, one run each (reluformer-translate --match-score)")
    args = parser.parse_args(argv)
    if args.units < 1:
        parser.error(f"--units: got {args.units}, expected >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        tmx = Path(tmp) / "memory.tmx"
        size = write_corpus_tmx(tmx, args.units)
        translate = [sys.executable, "-m", "reluformer_mt.cli.translate", "--checkpoint", args.checkpoint,
                     "--input", args.input, "--output", str(Path(tmp) / "out.txt"), "--device", "cpu"]
        # a first run unmeasured, with a small memory: it may compile the fused kernels (attention, the
        # memory's sparse maps), and /usr/bin/time reports the largest resident size in the process
        # tree (the compiler's, ~1.1 GB)
        small = Path(tmp) / "small.tsv"
        small.write_text("".join(f"{s}\t{t}\n" for s, t in corpus_pairs()[:50]), encoding="utf-8")
        peak_rss_mib(translate + ["--memory", str(small)])
        without, _ = peak_rss_mib(translate + ["--memory", "none"])
        for score in args.match_score:
            peak, seconds = peak_rss_mib(translate + ["--memory", str(tmx), "--match-score", score])
            print(f"tmx_translation: {args.units} units, {size / 2**20:.1f} MB TMX, --match-score {score}: peak RSS "
                  f"{without:.0f} MiB with --memory none, {peak:.0f} MiB with the TMX: the memory's extra peak "
                  f"+{peak - without:.0f} MiB ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
