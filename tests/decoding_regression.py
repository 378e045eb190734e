"""The translations of every decoding mode from small deterministic checkpoints, for the regression
test that keeps them identical, bit for bit, across refactorings of the decoder
(``tests/test_decoding_regression.py``).

Regenerate the stored outputs (only when a change is meant to change translations, and say so in
the commit):

    PYTHONPATH=. python tests/decoding_regression.py --write

It prepares six real IWSLT2017 talks with translation-memory neighbours, trains two tiny document
models (one without a memory, one reading it through memory attention; 30 updates each, one
thread), builds a kNN-MT datastore of the first and decodes a few test documents in every mode:
reluformer-translate's (DocumentTranslator) and fairseq-generate's (the task's generator).
"""
import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

EXPECTED = HERE / "data" / "decoding_regression.json"
UPDATES = 300
SEARCH = dict(beam=3, max_len_a=1.1, max_len_b=6, device="cpu")
DATASTORE_GENERATE = "fairseq-generate --knn-datastore"


@contextlib.contextmanager
def one_thread():
    """Training, the datastore's index and decoding on one thread: the same float sums whatever the
    session's threads (faiss's k-means sums per thread too)."""
    import faiss
    import torch

    before, before_faiss = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        faiss.omp_set_num_threads(before_faiss)


def build_setup(root) -> dict:
    """Data, the two checkpoints and the datastore under ``root``."""
    from helpers import USER_DIR, run_fairseq
    from test_translation_memory import TRAIN_TM

    from conftest import iwslt_files
    from reluformer_mt.data.prepare import PrepareConfig
    from reluformer_mt.knn.datastore import build_datastore
    from reluformer_mt.memory.neighbours import prepare_with_memory

    root = Path(root)
    data = root / "doc128"
    prepare_with_memory(PrepareConfig(out=str(data), fmt="docmt", src="en", tgt="de",
                                      train=[[str(p) for p in iwslt_files("dev")]],
                                      test=[[str(p) for p in iwslt_files("test")]], valid_from_train=1, limit_docs=6,
                                      segment_tokens=128, vocab_size=800, joined_dictionary=True, progress=False,
                                      memory_k=4))
    train = [a if a != "4" else str(UPDATES) for a in TRAIN_TM]  # --max-update
    checkpoints = {}
    with one_thread():
        for fusion in ("none", "attention"):
            save = root / fusion
            if not (save / "checkpoint_last.pt").is_file():
                run_fairseq("train", [data, "--user-dir", USER_DIR, "--task", "document_translation", *train,
                                      "--tm-fusion", fusion, "--tm-k", "1", "--save-dir", save])
            checkpoints[fusion] = save / "checkpoint_last.pt"
        store = root / "store"
        if not (store / "datastore.json").is_file():
            build_datastore(checkpoints["none"], store, progress=False)
    return {"data": data, "checkpoints": checkpoints, "store": store}


def fingerprints(setup) -> dict:
    """The trained weights' fingerprints: another CPU or library may train other weights, and
    then the stored outputs say nothing about the decoder."""
    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.knn.datastore import model_fingerprint

    return {name: model_fingerprint(load_model(path).model) for name, path in sorted(setup["checkpoints"].items())}


def datastore_fingerprint(setup) -> str:
    """sha256 of the corpus datastore's keys, values and index: the same weights can still give other
    keys or another IVF clustering on another CPU (its vector units sum floats in another order), and
    then the stored kNN-MT translations say nothing about the decoder."""
    digest = hashlib.sha256()
    for name in ("keys.npy", "values.npy", "index.faiss"):
        digest.update((setup["store"] / name).read_bytes())
    return digest.hexdigest()[:16]


def translator_modes(setup) -> dict:
    """mode -> (checkpoint name, DocumentTranslator keywords, translate() keywords)."""
    store = str(setup["store"])
    pieces = dict(pieces_weight=3.0, pieces_k=4, pieces_floor=0.1)
    knn = dict(knn_k=8, knn_lambda=0.6, knn_temperature=5.0)
    return {
        "plain": ("none", {}, {"scores": True}),
        "plain, alignments and 2-best": ("none", {"nbest": 2}, {"scores": True, "alignments": True}),
        "free separators": ("none", {"separators": "free"}, {"scores": True}),
        "sentence by sentence": ("none", {"segment_tokens": 0}, {"scores": True}),
        "ensemble of two": (["none", "none"], {}, {"scores": True}),
        "pieces": ("none", pieces, {"scores": True}),
        "pieces, free separators": ("none", {**pieces, "separators": "free"}, {"scores": True}),
        # eflomal samples its alignment at random: the memory's word links are fixed ones here
        "pieces aligned (diagonal word links)": ("none", {**pieces, "pieces_aligned": True, "pieces_max_n": 3},
                                                 {"scores": True}),
        "knn full datastore": ("none", {"knn": store, **knn}, {"scores": True}),
        "knn full datastore, relu read-out": ("none", {"knn": store, "knn_readout": "relu", "knn_radius": 40.0,
                                                       "knn_lambda": 0.8}, {"scores": True}),
        "knn full datastore, sentence by sentence": ("none", {"knn": store, "segment_tokens": 0, **knn},
                                                     {"scores": True}),
        "knn per-input": ("none", {"knn_memory": True, "knn_memory_k": 3, **knn}, {"scores": True}),
        "knn + pieces": ("none", {"knn": store, **knn, **pieces}, {"scores": True}),
        "knn per-input + pieces": ("none", {"knn_memory": True, **knn, **pieces}, {"scores": True}),
        "memory attention": ("attention", {}, {"scores": True}),
        "memory attention, no matches": ("attention", {"memory": "none"}, {"scores": True}),
        "memory attention + pieces": ("attention", pieces, {"scores": True}),
        "memory attention + knn per-input": ("attention", {"knn_memory": True, **knn}, {"scores": True}),
    }


def documents(setup):
    from reluformer_mt.memory.tm import read_prepared

    test = read_prepared(setup["data"], "test")
    return [test.sources[:6], test.sources[6:9], [test.sources[9]]]


def _result(r) -> dict:
    out = {"text": r.text, "score": r.score}
    if r.alignment is not None:
        out["alignment"] = [list(pair) for pair in r.alignment]
    if r.match is not None:
        out["match"] = [r.match[0], r.match[1]]
    if r.alternatives:
        out["alternatives"] = [_result(a) for a in r.alternatives]
    return out


def fix_word_links(setup) -> None:
    """Links (i, i) for every word pair of every training-memory entry, put where the translator's
    process cache of eflomal's alignments (:func:`reluformer_mt.inference.memory.memory_word_links`)
    looks, so that the aligned pieces are the same on every run."""
    from reluformer_mt.inference import memory
    from reluformer_mt.memory.tm import read_prepared

    entries = read_prepared(setup["data"])
    memory._WORD_LINKS[memory.content_key(entries)] = [
        {(i, i) for i in range(min(len(s.split()), len(t.split())))} for s, t in zip(entries.sources, entries.targets)]


def translate_mode(setup, name, keywords, call) -> dict:
    from reluformer_mt.inference import DocumentTranslator

    if keywords.get("pieces_aligned"):
        fix_word_links(setup)
    names = name if isinstance(name, list) else [name]
    checkpoint = [setup["checkpoints"][n] for n in names]
    translator = DocumentTranslator(checkpoint if len(checkpoint) > 1 else checkpoint[0], **SEARCH, **keywords)
    results = translator.translate(documents(setup), progress=False, **call)
    stats = {k: v for k, v in sorted(translator.stats.items()) if k != "seconds"}
    return {"documents": [[_result(r) for r in doc] for doc in results], "stats": stats}


def generate_modes(setup) -> dict:
    """fairseq-generate on the valid split (one talk): plain, and with the task's kNN-MT options."""
    from helpers import USER_DIR, run_fairseq

    common = [setup["data"], "--user-dir", USER_DIR, "--task", "document_translation",
              "--path", setup["checkpoints"]["none"], "--gen-subset", "valid", "--beam", "3", "--max-len-a", "1.1",
              "--max-len-b", "6", "--max-sentences", "8", "--cpu", "--no-progress-bar"]
    modes = {"fairseq-generate": [],
             DATASTORE_GENERATE: ["--knn-datastore", setup["store"], "--knn-k", "8",
                                                  "--knn-lambda", "0.6", "--knn-temperature", "5"]}
    out = {}
    for name, extra in modes.items():
        printed = run_fairseq("generate", common + [str(a) for a in extra], capture=True)
        out[name] = sorted(line for line in printed.splitlines() if line[:2] in ("H-", "P-"))
    return out


def decode_every_mode(setup) -> dict:
    with one_thread():
        specs = translator_modes(setup)  # (a spec's keyword "knn" is the corpus datastore; "knn_memory" is per-input)
        modes = {mode: translate_mode(setup, *spec) for mode, spec in specs.items()}
        return {"fingerprints": fingerprints(setup), "datastore fingerprint": datastore_fingerprint(setup),
                "translator": modes, "generate": generate_modes(setup),
                "datastore modes": sorted(m for m, spec in specs.items() if "knn" in spec[1]) + [DATASTORE_GENERATE]}


def main(argv=None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write the outputs to {EXPECTED}")
    p.add_argument("--work", help="folder for the data and checkpoints (default: a temporary one); kept, and reused")
    p.add_argument("--out", help="write the outputs here instead (e.g. to compare two runs)")
    args = p.parse_args(argv)
    from reluformer_mt.plugin import register

    register()
    with contextlib.ExitStack() as stack:
        work = args.work or stack.enter_context(tempfile.TemporaryDirectory())
        outputs = decode_every_mode(build_setup(work))
    target = Path(args.out) if args.out else EXPECTED if args.write else None
    text = json.dumps(outputs, indent=1, ensure_ascii=False) + "\n"
    if target is None:
        print(text)
    else:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
