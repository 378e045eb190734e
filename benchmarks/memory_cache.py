"""What ``--memory-cache float16`` changes in a demo run's translations: a memory-attention family's
test modes (the demo's decodes, each with the values its tuner chose) decoded twice, with the
readers' keys and values kept in float32 and in float16, s-BLEU of each and how many verses come
out the same. The speed is benchmarks/guided_decoding.py's (docs/PERFORMANCE.md).

    .venv/bin/python benchmarks/memory_cache.py --run runs/demo --family softmax+tm

writes ``docs/benchmarks/memory-cache.json`` (``--json FILE``); docs/history/TRANSLATION_MEMORY.md's
table comes from it. One thread; about 10 minutes on the demo's checkpoints (12 decodes).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("constrained", "sentence", "pieces", "knn", "knn-memory", "knn+pieces")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="a finished demo run's folder")
    p.add_argument("--family", default="softmax+tm", help="a family of that run trained with --tm-fusion attention")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated demo modes")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parents[1] / "docs/benchmarks/memory-cache.json")
    args = p.parse_args(argv)
    checkpoint = args.run / "checkpoints" / args.family / "document" / "checkpoint_last.pt"
    tuned_file = args.run / "report" / f"tune_{args.family.replace('+', '_')}.json"
    for path in (checkpoint, tuned_file):
        if not path.is_file():
            p.error(f"{path}: not found; --run names a finished `make demo-full` folder, --family a family of it")
    data = next((args.run / "data").glob("doc*"), None)
    if data is None:
        p.error(f"{args.run / 'data'}: no document-level data directory")

    import torch

    torch.set_num_threads(1)
    from reluformer_mt.experiments import demo
    from reluformer_mt.experiments import demo_translate as modes
    from reluformer_mt.experiments.demo_options import DemoOptions

    o = DemoOptions(out=args.run, families=[args.family])
    tuned = json.loads(tuned_file.read_text())
    rows = {}
    for mode in args.modes.split(","):
        options = modes.mode_options(o, mode, tuned, modes.datastore_dir(args.run, args.family))
        if options is None:
            continue
        row, texts = {}, {}
        for cache in ("float32", "float16"):
            result = demo.bleu_of_model(o, checkpoint, data, memory_cache=cache, **options)
            texts[cache] = [s for doc in result["hypotheses"].values() for s in doc]
            row[cache] = round(result["s_bleu"], 2)
        row["verses"] = len(texts["float32"])
        row["same"] = sum(a == b for a, b in zip(texts["float32"], texts["float16"]))
        rows[mode] = row
        print(f"{mode:12s} s-BLEU float32 {row['float32']:6.2f}  float16 {row['float16']:6.2f}  "
              f"same verses {row['same']}/{row['verses']}", flush=True)
    report = {"modes": rows, "checkpoint": str(checkpoint), "command": "benchmarks/memory_cache.py " + " ".join(
        sys.argv[1:] if argv is None else argv)}
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
