"""The read-out study of kNN-MT: softmax against ReLU over k = 4, 16, 64, 256 value slots, per fuzzy band.

The ReLUFormer paper (Shen et al. 2023, arXiv:2302.06461) argues that ReLU attention reads a large
number of value slots better than softmax, whose weights must spread over all of them. A kNN-MT
datastore is such a read-out: a step's k nearest entries are the value slots. For every family of
a finished demo run (its checkpoints and full datastores) and every (read-out, k):

1. the validation chapters choose lambda and T / radius (the tuner's teacher-forced grid,
   :func:`reluformer_mt.experiments.knn_tune.grid_scores`, restricted to that k);
2. the test chapters report, never tune: the reference tokens' mean negative log-likelihood under
   the mixture, per band of the verse's best memory match (the bands of the demo's tables), beside
   the model alone;
3. with ``--decode FAMILY``: that family's test chapters decoded with each setting (the document
   translator, beam as the demo) and scored per band with s-BLEU beside copying the match.

    python -m reluformer_mt.experiments.readout_study runs/demo --decode softmax

writes ``report/readout_study.json`` and ``readout_study.md`` in the run folder and prints the tables.
"""
import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch

from reluformer_mt.evaluation.reports import markdown_table, write_json
from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.experiments.knn_tune import GRID_K, ForcedSplit, fixed_nll, grid_scores, read_split_sentences
from reluformer_mt.memory.tm import FUZZY_BANDS, band_of

READOUTS = ("softmax", "relu")
BANDS = tuple(name for _, _, name in FUZZY_BANDS) + ("all",)


def demo_checkpoint(run_dir: Path, family: str) -> Path:
    """The checkpoint the demo translates with: the document phase's last."""
    for path in (run_dir / "checkpoints" / family / "document" / "checkpoint_last.pt",
                 run_dir / "checkpoints" / family / "checkpoint_last.pt"):
        if path.is_file():
            return path
    raise ValueError(f"{run_dir}/checkpoints/{family}: no checkpoint_last.pt (is {run_dir} a finished demo run?)")


def token_bands(forced: ForcedSplit, fuzzy: Sequence[float]) -> np.ndarray:
    """The band of every forced token: that of its verse's best memory match."""
    first = torch.tensor([info.first_sentence for info in forced.infos])
    verse = (first[forced.examples] + forced.sentences).numpy()
    return np.array([band_of(float(fuzzy[v])) for v in verse])


def best_settings(rows: List[dict], readout: str, k: int) -> dict:
    mine = min((r for r in rows if r["readout"] == readout and r["k"] == k), key=lambda r: r["nll"])
    return {"readout": readout, "k": k, "lam": mine["lam"], "temperature": mine["temperature"],
            "radius": mine["radius"], "spread": mine["spread"], "valid_nll": mine["nll"]}


def study_family(run_dir: Path, family: str, data_dir: Path, ks: Sequence[int], device: str = "cpu",
                 progress=print) -> dict:
    """Validation choice and test NLL per band of every (read-out, k) for one family."""
    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.inference.translator import DocumentTranslator
    from reluformer_mt.knn.datastore import Datastore, model_fingerprint

    checkpoint = demo_checkpoint(run_dir, family)
    loaded = load_model(checkpoint, data_dir, device=device)
    model, task = loaded.model, loaded.task
    store = Datastore.load(run_dir / "knn" / family, fingerprint=model_fingerprint(model), checkpoint=str(checkpoint))
    searched = max(ks)
    result = {"checkpoint": str(checkpoint), "datastore_entries": store.size, "settings": []}
    forced, neighbours = {}, {}
    for split in ("valid", "test"):
        forced[split] = ForcedSplit(model, task, split, device=device)
        d, v = store.search(forced[split].states.numpy(), searched)
        neighbours[split] = (torch.from_numpy(d), torch.from_numpy(v.astype(np.int64)))
    rows, scale = grid_scores(forced["valid"], *neighbours["valid"], readouts=READOUTS, ks=ks)
    # the test verses' best memory match, found as the translator finds it
    probe = DocumentTranslator(checkpoint, data=data_dir, device=device, knn_memory=True)
    _, scores = probe.memory.lookup(read_split_sentences(data_dir, "test"))
    bands = token_bands(forced["test"], scores[:, 0])
    test = forced["test"]
    members = {band: torch.from_numpy(np.nonzero(bands == band)[0] if band != "all" else np.arange(len(bands)))
               for band in BANDS}
    result["tokens"] = {band: int(len(idx)) for band, idx in members.items()}
    result["model_nll"] = {band: float(-test.lp_ref[idx].double().mean()) if len(idx) else None
                           for band, idx in members.items()}
    for readout in READOUTS:
        for k in ks:
            setting = best_settings(rows, readout, k)
            setting["test_nll"] = {band: fixed_nll(test, *neighbours["test"], setting, idx) if len(idx) else None
                                   for band, idx in members.items()}
            result["settings"].append(setting)
    result["scale"] = scale
    progress(f"readout study: {family}: {len(test):,} test tokens, {len(forced['valid']):,} validation tokens")
    return result


def decode_family(run_dir: Path, family: str, data_dir: Path, settings: List[dict], beam: int, device: str = "cpu",
                  progress=print) -> dict:
    """s-BLEU per band of the test chapters decoded with each setting, beside the plain model and copying the match."""
    from reluformer_mt.memory.maintenance.bands import band_scores
    from reluformer_mt.experiments.knn_tune import split_documents
    from reluformer_mt.inference.translator import DocumentTranslator
    from reluformer_mt.knn.search import KnnOptions

    checkpoint = demo_checkpoint(run_dir, family)
    sources, references, _ = split_documents(data_dir, "test")
    refs = [r for doc in references for r in doc]
    systems, seconds = {}, {}
    runs = [("model alone", {})] + [
        (f"{s['readout']} k={s['k']}", {"knn": run_dir / "knn" / family, **KnnOptions(
            k=s["k"], lam=s["lam"], temperature=s["temperature"], radius=s["radius"], readout=s["readout"]
        ).translator_options()}) for s in settings]
    for name, options in runs:
        translator = DocumentTranslator(checkpoint, data=data_dir, device=device, beam=beam, **options)
        start = time.time()
        results = translator.translate(sources, progress=False)
        systems[name] = [r.text for doc in results for r in doc]
        seconds[name] = round(time.time() - start, 1)
        progress(f"readout study: {family} {name}: decoded in {seconds[name]} s")
    probe = DocumentTranslator(checkpoint, data=data_dir, device=device, knn_memory=True)
    ids, fuzzy = probe.memory.lookup([s for doc in sources for s in doc])
    systems["copy of the match"] = [(probe.memory.target(int(i)) if i >= 0 else None) or "" for i in ids[:, 0]]
    return {"bands": band_scores(refs, fuzzy[:, 0].tolist(), systems), "systems": list(systems), "seconds": seconds}


def render(study: dict) -> str:
    lines = ["Test NLL per token (nats; lower is better) by the verse's best memory match band; lambda and "
             "T / radius chosen on the validation chapters at each k:", ""]
    for family, r in study["families"].items():
        headers = ["read-out", "k", "lambda", "T or radius (x scale)"] + [f"{b} ({r['tokens'][b]} tok)" for b in BANDS]
        rows = [["model alone", "", "", ""] + [r["model_nll"][b] for b in BANDS]]
        rows += [[s["readout"], s["k"], s["lam"], s["spread"]] + [s["test_nll"][b] for b in BANDS] for s in r["settings"]]
        lines += [f"**{family}** ({r['datastore_entries']:,} datastore entries)", "", markdown_table(headers, rows, 3), ""]
    for family, d in study.get("decoded", {}).items():
        headers = ["band", "verses"] + d["systems"]
        rows = [[b["band"], b["sentences"]] + [b.get(s) for s in d["systems"]] for b in d["bands"]]
        lines += [f"Test s-BLEU per band, {family} decoded with each setting:", "", markdown_table(headers, rows), ""]
    return "\n".join(lines)


def run_study(run_dir: Path, families: Optional[Sequence[str]] = None, ks: Sequence[int] = GRID_K,
              decode: Sequence[str] = (), device: str = "cpu", progress=print) -> dict:
    report = json.loads((run_dir / "report" / "report.json").read_text(encoding="utf-8"))
    data_dir = Path(report["data"]["doc"])
    if not data_dir.is_absolute() and not data_dir.exists():
        data_dir = run_dir / "data" / data_dir.name
    families = list(families or [f for f in report["models"] if (run_dir / "knn" / f).is_dir()])
    study = {"run": str(run_dir), "ks": list(ks), "families": {}, "decoded": {}}
    for family in families:
        study["families"][family] = study_family(run_dir, family, data_dir, ks, device, progress)
    for family in decode:
        study["decoded"][family] = decode_family(run_dir, family, data_dir, study["families"][family]["settings"],
                                                 report["options"]["beam"], device, progress)
    write_json(run_dir / "report" / "readout_study.json", study, command=" ".join(sys.argv))
    write_text_atomically(run_dir / "report" / "readout_study.md", render(study))
    return study


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.readout_study",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a finished reluformer-demo run folder (with its kNN-MT datastores)")
    p.add_argument("--families", help="comma-separated (default: every family with a datastore)")
    p.add_argument("--ks", default=",".join(map(str, GRID_K)), help="the k of each setting (at most 256)")
    p.add_argument("--decode", default="", help="comma-separated families whose test chapters are decoded per setting")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",")]
        if not ks or min(ks) < 1 or max(ks) > max(GRID_K):
            raise ValueError
    except ValueError:
        print(f"readout_study: error: --ks: expected comma-separated k from 1 to {max(GRID_K)}, got {args.ks!r}",
              file=sys.stderr)
        return 2
    run_dir = Path(args.run)
    if not (run_dir / "report" / "report.json").is_file():
        print(f"readout_study: error: {run_dir}/report/report.json: no such file (a finished demo run?)", file=sys.stderr)
        return 2
    families = [f for f in (args.families or "").split(",") if f] or None
    decode = [f for f in args.decode.split(",") if f]
    study = run_study(run_dir, families, ks, decode, args.device,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
