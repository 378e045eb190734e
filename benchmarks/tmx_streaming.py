"""Peak memory of reading a generated TMX file (issue 34: the reader must stream in constant memory).

Writes a TMX 1.4b file of ``--units`` translation units (distinct en/de sentences of ~8 words,
a placeholder in every tenth), then reads it with ``read_tmx`` in a fresh Python process and
prints one line: units, file size, seconds, and the process's peak RSS before and after reading
(the growth holds the entries' own strings, which any reader keeps, plus whatever XML it keeps).
``--units 0`` of the same file layout is the baseline of the process itself.

    .venv/bin/python benchmarks/tmx_streaming.py --units 100000
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

READER = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from reluformer_mt.memory.tm import read_tmx
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
entries = read_tmx({path!r}, "en", "de")
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
text = sum(len(s) + len(t) for s, t in zip(entries.sources, entries.targets))
print(json.dumps(dict(entries=len(entries), seconds=seconds, rss_before_kb=before, rss_after_kb=after, text_chars=text)))
"""


def write_tmx(path: Path, units: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write('<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header srclang="en" datatype="plaintext" '
                'segtype="sentence" adminlang="en" o-tmf="x" creationtool="bench" creationtoolversion="1"/>\n<body>\n')
        for i in range(units):
            ph = '<ph x="1">{0}</ph>' if i % 10 == 0 else " "
            f.write(f'<tu tuid="{i}"><tuv xml:lang="en-US"><seg>The sentence number {i} says{ph}something short</seg></tuv>'
                    f'<tuv xml:lang="de-DE"><seg>Der Satz Nummer {i} sagt{ph}etwas Kurzes</seg></tuv></tu>\n')
        f.write("</body></tmx>\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.units < 1:
        parser.error(f"--units: got {args.units}, expected >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.tmx"
        write_tmx(path, args.units)
        size = path.stat().st_size
        run = subprocess.run([sys.executable, "-c", READER.format(repo=str(REPO), path=str(path))],
                             capture_output=True, text=True, check=True)
        result = json.loads(run.stdout.strip().splitlines()[-1])
    growth = (result["rss_after_kb"] - result["rss_before_kb"]) / 1024
    print(f"tmx_streaming: {result['entries']} units, {size / 2**20:.1f} MB file, read in {result['seconds']:.1f} s; "
          f"peak RSS {result['rss_before_kb'] / 1024:.1f} MB before reading, {result['rss_after_kb'] / 1024:.1f} MB "
          f"after (+{growth:.1f} MB, of which the entries' {result['text_chars'] / 2**20:.1f} M characters of text)")


if __name__ == "__main__":
    main()
