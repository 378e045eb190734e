"""Benchmark of guided decoding against the plain model: speed ratios and a profile of each mode.

Modes (reluformer-translate's ``DocumentTranslator``, the test split, beam 4, one thread):
- ``knn``: kNN-MT over the corpus datastore (``--datastore``; built from ``--checkpoint`` into
  ``--out`` when not given), against the plain model;
- ``knn-per-input``: per-input datastores of each sentence's memory matches (SK-MT), against plain;
- ``memory-attention``: ``--memory-checkpoint`` (trained with ``--tm-fusion attention``) with its
  matches, against the same model without matches (``memory="none"``);
- ``pieces``: translation pieces (weight 10, k 8), against the plain model.
The modes and their baselines run interleaved ``--repeats`` times (each repetition in another
order); a mode's ratio is the median of the repetitions' sentences/s ratios to its baseline, its
spread their min and max. ``--profile`` adds one timed pass per mode: where its time goes
(encoder, decoder, the guidance parts, the datastore search, the per-input force-decoding, the
memory lookup; the rest is fairseq's beam search and Python around it) and the beam rows it ran.
The numbers are written to ``--json`` (``docs/benchmarks/guided-decoding.json`` by default).

    .venv/bin/python benchmarks/guided_decoding.py --checkpoint runs/demo/checkpoints/softmax/document/checkpoint_best.pt \\
        --memory-checkpoint runs/demo/checkpoints/softmax+tm/document/checkpoint_best.pt \\
        --data runs/demo/data/doc128.v2000 --datastore runs/demo/knn/softmax --profile

``--tuned FILE`` (a ``reluformer-memory tune --json`` report, e.g. the demo's
``runs/demo/report/tune_softmax.json``) measures the values and the search the tuner chose on
validation (k, lambda, read-out, adaptive, probe, search every N steps, batched per-input search,
the pieces' weight and floor), as ``reluformer-translate`` and the demo decode; without it the
fixed values below. ``--set MODE:NAME=VALUE`` gives a mode a translator keyword (``--set
knn:knn_probe=1``, to compare options); ``--modes`` picks some of the modes.
"""
import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("knn", "knn-per-input", "memory-attention", "pieces")
KNN = dict(knn_k=16, knn_lambda=0.5, knn_temperature=10.0)  # knn_mt.py's search values
PIECES = dict(pieces_weight=10.0, pieces_k=8)  # the demo's
DEFAULT_JSON = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "guided-decoding.json"


def one_core():
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)


def test_documents(data: Path, sentences: int):
    """The test split's sources in documents of 20 sentences (the first ``sentences``; 0: all)."""
    from reluformer_mt.memory.tm import read_prepared

    test = read_prepared(data, "test").sources
    test = test[:sentences] if sentences else test
    return [test[i:i + 20] for i in range(0, len(test), 20)], len(test)


def tuned_values(path: str) -> dict:
    """mode -> translator keywords from a tuner report's ``chosen`` values (the datastore's own tuned
    values and search are read by the translator itself: ``knn`` then needs only the datastore)."""
    from reluformer_mt.knn.search import KnnOptions

    chosen = json.loads(Path(path).read_text(encoding="utf-8"))["chosen"]
    out = {"knn": {}, "pieces": {k: v for k, v in chosen["pieces"].items() if k in ("pieces_weight", "pieces_floor", "pieces_length_cap")}}
    if "per_input" in chosen:
        per_input = chosen["per_input"]
        out["knn-per-input"] = {**KnnOptions(**per_input["options"]).translator_options(), **per_input["search"]["chosen"]}
    return out


def systems_of(args, store) -> dict:
    """name -> (checkpoint, translator keywords); each mode's baseline among them."""
    wanted = args.modes.split(",")
    tuned = tuned_values(args.tuned) if args.tuned else {"knn": KNN, "knn-per-input": KNN, "pieces": PIECES}
    out = {"plain": (args.checkpoint, {})}
    if "knn" in wanted:
        out["knn"] = (args.checkpoint, {"knn": store, **tuned["knn"]})
    if "knn-per-input" in wanted:
        out["knn-per-input"] = (args.checkpoint, {"knn_memory": True, **tuned["knn-per-input"]})
    if "memory-attention" in wanted and args.memory_checkpoint:
        out["memory-attention, no matches"] = (args.memory_checkpoint, {"memory": "none"})
        out["memory-attention"] = (args.memory_checkpoint, {})
    if "pieces" in wanted:
        out["pieces"] = (args.checkpoint, {**tuned["pieces"], "pieces_k": PIECES["pieces_k"]})
    for item in args.set:
        mode, _, assignment = item.partition(":")
        name, _, value = assignment.partition("=")
        if mode not in out or not name:
            raise SystemExit(f"--set {item}: expected MODE:NAME=VALUE with MODE one of {', '.join(out)}")
        out[mode][1][name] = json.loads(value) if value[:1] in "0123456789-[{tfn" else value
    return out


BASELINE = {"knn": "plain", "knn-per-input": "plain", "memory-attention": "memory-attention, no matches",
            "pieces": "plain"}


def interleaved(translators: dict, documents, repeats: int, clock) -> dict:
    """name -> seconds of each repetition, every repetition starting with another system."""
    names = list(translators)
    seconds = {name: [] for name in names}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = clock()
            translators[name].translate(documents, progress=False)
            seconds[name].append(clock() - start)
    return seconds


def rows_of(seconds: dict, sentences: int) -> dict:
    """Each mode's ratio (sentences/s against its baseline, paired by repetition) and spread."""
    modes = {}
    for mode, base in BASELINE.items():
        if mode not in seconds:
            continue
        ratios = [b / m for b, m in zip(seconds[base], seconds[mode])]
        modes[mode] = {"ratio": round(statistics.median(ratios), 3), "spread": [round(min(ratios), 3), round(max(ratios), 3)],
                       "sentences_per_s": round(sentences / statistics.median(seconds[mode]), 2), "baseline": base,
                       "baseline_sentences_per_s": round(sentences / statistics.median(seconds[base]), 2)}
        if mode == "pieces":  # the pieces' target is in time: time with / without them
            modes[mode]["time_ratio"] = round(statistics.median([m / b for b, m in zip(seconds[base], seconds[mode])]), 3)
    return modes


class Profile:
    """Inclusive seconds of named calls during a pass, by wrapping them where they are looked up."""

    def __init__(self, clock):
        self.clock = clock
        self.seconds, self.calls = {}, {}
        self._undo = []

    def wrap(self, owner, attribute: str, label: str) -> None:
        original, own = getattr(owner, attribute), attribute in vars(owner)

        def timed(*a, **kw):
            start = self.clock()
            try:
                return original(*a, **kw)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + self.clock() - start
                self.calls[label] = self.calls.get(label, 0) + 1
        setattr(owner, attribute, timed)
        self._undo.append((owner, attribute, original, own))

    def undo(self) -> None:
        for owner, attribute, original, own in reversed(self._undo):
            if own:
                setattr(owner, attribute, original)
            else:  # an instance's method: its class's again
                delattr(owner, attribute)
        self._undo = []


# what a pass is split into: (owner's import path, attribute, label); nested labels are inside the
# one above them (a part's apply inside the beam search's step)
PROFILED = [
    ("reluformer_mt.inference.memory:MemoryLookup", "lookup", "memory lookup (retrieval of matches)"),
    ("reluformer_mt.guidance.base:GuidedSearch", "start", "guidance start (per-batch tables, datastores)"),
    ("reluformer_mt.guidance.knn:KnnMixture", "decode_entries", "  per-input: force-decoding the matches"),
    ("reluformer_mt.knn.search:PerInputDatastores", "__init__", "  per-input: building the datastores"),
    ("reluformer_mt.guidance.base:GuidedSearch", "step", "beam search step with guidance"),
    ("reluformer_mt.knn.search:KnnMixer", "mix", "  kNN-MT mixture"),
    ("reluformer_mt.knn.search:FullDatastore", "neighbours", "    corpus datastore search"),
    ("reluformer_mt.knn.search:PerInputDatastores", "neighbours", "    per-input datastore search"),
    ("reluformer_mt.guidance.piece_table:PieceTable", "add_bonus", "  translation pieces bonus"),
    ("reluformer_mt.guidance.separators:SeparatorConstraint", "apply", "  separator constraint"),
]


def profile_pass(translator, documents, clock) -> dict:
    """One pass of ``translator`` with its encoder, decoder and guidance timed; seconds and shares."""
    import importlib

    profile = Profile(clock)
    profile.wrap(translator.model.encoder, "forward", "encoder")
    profile.wrap(translator.model.decoder, "forward", "decoder (incl. output projection)")
    for target, attribute, label in PROFILED:
        module, _, name = target.partition(":")
        owner = getattr(importlib.import_module(module), name, None)
        if owner is not None and hasattr(owner, attribute):
            profile.wrap(owner, attribute, label)
    rows = {"rows": 0, "steps": 0}

    def count(module, inputs, output):
        rows["steps"] += 1
        rows["rows"] += inputs[0].size(0)
    handle = translator.model.decoder.output_projection.register_forward_hook(count)
    start = clock()
    try:
        translator.translate(documents, progress=False)
    finally:
        total = clock() - start
        handle.remove()
        profile.undo()
    out = {"seconds": round(total, 3), "decoder_steps": rows["steps"], "beam_rows": rows["rows"], "parts": {}}
    for label in sorted(profile.seconds, key=lambda lab: [i for i, p in enumerate(PROFILED) if p[2] == lab] or [-1]):
        out["parts"][label] = {"seconds": round(profile.seconds[label], 3), "share": round(profile.seconds[label] / total, 3),
                               "calls": profile.calls[label]}
    return out


def print_profile(name: str, p: dict) -> None:
    print(f"profile {name}: {p['seconds']:.2f} s, {p['decoder_steps']} decoder steps, {p['beam_rows']} beam rows", flush=True)
    for label, part in p["parts"].items():
        print(f"    {label:48s} {part['seconds']:7.2f} s  {100 * part['share']:5.1f} %  ({part['calls']} calls)", flush=True)


def datastore_of(args):
    if args.datastore:
        return args.datastore
    from reluformer_mt.knn.datastore import build_datastore

    directory = Path(args.out) / "datastore"
    if not (directory / "datastore.json").is_file():
        build_datastore(args.checkpoint, directory, data=args.data, progress=False)
    return str(directory)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="the plain model (knn, knn-per-input, pieces and the baseline)")
    p.add_argument("--memory-checkpoint", help="a model trained with --tm-fusion attention (memory-attention)")
    p.add_argument("--data", required=True, help="the prepared directory (test split; its training split is the memory)")
    p.add_argument("--datastore", help="the plain model's kNN-MT datastore (default: built into --out)")
    p.add_argument("--out", default="runs/guided_bench")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, some of {', '.join(MODES)}")
    p.add_argument("--sentences", type=int, default=0, help="test sentences translated (0: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--tuned", metavar="FILE", help="a tuner report (reluformer-memory tune --json; the demo's "
                   "report/tune_FAMILY.json): measure the values and search it chose")
    p.add_argument("--set", action="append", default=[], metavar="MODE:NAME=VALUE", help="a translator keyword of a mode")
    p.add_argument("--profile", action="store_true", help="one more pass per mode, timed part by part")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="elapsed seconds, or this thread's CPU seconds (a machine shared with other jobs)")
    p.add_argument("--json", default=str(DEFAULT_JSON))
    args = p.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"--modes: {', '.join(sorted(unknown))}: expected some of {', '.join(MODES)}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.plugin import register

    register()
    one_core()
    documents, sentences = test_documents(Path(args.data), args.sentences)
    store = datastore_of(args) if "knn" in args.modes.split(",") else None
    systems = systems_of(args, store)
    translators = {name: DocumentTranslator(checkpoint, data=args.data, beam=args.beam, quiet=True, **kw)
                   for name, (checkpoint, kw) in systems.items()}
    for translator in translators.values():  # warm-up: caches (word links, retrievers) filled once for all
        translator.translate(documents[:1], progress=False)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    report = {}
    if args.profile:
        report["profile"] = {name: profile_pass(t, documents, clock) for name, t in translators.items()}
        for name, p in report["profile"].items():
            print_profile(name, p)
    seconds = interleaved(translators, documents, args.repeats, clock)
    report = {"modes": rows_of(seconds, sentences), "plain_sentences_per_s": round(sentences / statistics.median(seconds["plain"]), 2),
              "command": " ".join(["benchmarks/guided_decoding.py", *(argv if argv is not None else sys.argv[1:])]),
              "sentences": sentences, "repeats": args.repeats, "beam": args.beam, "clock": args.clock,
              "options": {name: kw for name, (_, kw) in systems.items()}, "seconds": seconds, **report}
    for mode, row in report["modes"].items():
        print(f"{mode:18s} {row['sentences_per_s']:7.1f} sentences/s  {row['ratio']:.2f}x {row['baseline']} "
              f"[{row['spread'][0]:.2f}-{row['spread'][1]:.2f}]", flush=True)
    print(f"plain {report['plain_sentences_per_s']:.1f} sentences/s", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
