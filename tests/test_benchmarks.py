"""benchmarks/run.py: the paired-ratio helper, and one in-process run at the smallest sizes."""
import json

import pytest
import torch

from helpers import load_benchmark_script


@pytest.fixture(scope="module")
def bench():
    return load_benchmark_script()


def test_paired_ratio_median_and_spread(bench):
    ratio = bench.paired_ratio([1.0, 4.0, 9.0], [1.0, 2.0, 3.0])  # per repetition: 1, 2, 3
    assert ratio["per_rep"] == [1.0, 2.0, 3.0]
    assert ratio["median"] == 2.0
    assert (ratio["q1"], ratio["q3"], ratio["half_iqr"]) == (1.5, 2.5, 0.5)
    assert (ratio["min"], ratio["max"]) == (1.0, 3.0)
    assert bench.fmt_ratio(ratio) == "2.00±0.50"
    # pairing: a slow round that hits both variants alike leaves the ratio at 1
    assert bench.paired_ratio([1.0, 5.0], [1.0, 5.0])["median"] == 1.0


def test_round_robin_rotates_the_order(bench):
    order = []
    variants = {name: (lambda name=name: order.append(name)) for name in "abc"}
    times = bench.round_robin(variants, reps=3, warmup=0)
    assert order == list("abc" "bca" "cab")
    assert all(len(t) == 3 for t in times.values())


def test_smallest_run(bench, tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        results = bench.main(["--threads", "1", "--clock", "cpu", "--reps", "2", "--no-memory",
                              "--kernel-lengths", "64", "--train-lengths", "64", "--infer-lengths", "64",
                              "--segment-lengths", "48", "--decode-lengths", "8", "--tokens-per-batch", "96",
                              "--vocab", "64", "--model-size", "1,32,64,2", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    saved = json.loads((tmp_path / "benchmark.json").read_text(encoding="utf-8"))
    assert saved["summary"]["line"] == results["summary"]["line"]
    assert saved["git"]["commit"] is None or len(saved["git"]["commit"]) == 40
    assert "dirty" in saved["git"]

    # every non-reference row has the paired ratio with its spread
    for table in ("kernel", "sublayer", "training", "decoding"):
        timed = [r for r in saved[table] if "skipped" not in r]
        assert all(len(r["times_s"]) == 2 for r in timed), table
        ratios = [r["ratio"] for r in timed if "ratio" in r]
        assert ratios, table
        for ratio in ratios:
            assert {"median", "q1", "q3", "half_iqr", "min", "max", "per_rep"} <= set(ratio)
            assert len(ratio["per_rep"]) == 2 and ratio["min"] <= ratio["median"] <= ratio["max"]

    impls = {r["impl"] for r in saved["sublayer"]}
    assert {"fairseq_softmax_copy", "reluformer_default", "rela_default"} <= impls
    assert {r["path"] for r in saved["sublayer"] if r["impl"].endswith("_default")} <= {"direct", "dense", "blocked", "fused"}
    assert any(r["auto"] for r in saved["kernel"])
    copies = [r for r in saved["training"] if r["model"] == "fairseq_transformer_copy"]
    assert copies and all("ratio" in r for r in copies)
    assert all("vs_softmax" in r for r in saved["training"] if r["model"] in ("sparsemax", "entmax15"))
    assert len(saved["summary"]["reference_copy_ratios"]) == 2 + 2 + 1  # sublayer train/infer, 2 settings, 1 length

    summary = [line for line in printed.splitlines() if line.startswith("SUMMARY ")]
    assert len(summary) == 1 and summary[0] == saved["summary"]["line"]
    for part in ("kernel fwd ≤1.00", "kernel fwd+bwd ≤1.00", "sublayer train ≤1.00", "sublayer infer ≤1.00",
                 "training tok/s ≥1.00", "decoding ≥1.00", "sparsemax/entmax15 tok/s of softmax ≥0.80",
                 "noise check: reference copy"):
        assert part in summary[0], part
    assert printed.rstrip().splitlines()[-1] == summary[0]  # the last line


def test_training_speed_rows_and_order(monkeypatch, capsys):
    """benchmarks/training_speed.py (issue 22): per configuration, setting and thread count every
    family against fairseq's transformer and our softmax, the softmax copy as the noise check,
    the 2-thread rows after all 1-thread rows, one SUMMARY line."""
    import importlib.util

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("benchmarks_training_speed", REPO / "benchmarks" / "training_speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    small = dict(speed.CONFIGS["demo"], vocab=64, tokens=96, settings=[("sentence", 12), ("segment48", 48)],
                 dims=speed.CONFIGS["demo"]["dims"][:-1] + ["--encoder-layers", "1", "--decoder-layers", "1",
                                                           "--share-all-embeddings"])
    monkeypatch.setitem(speed.CONFIGS, "small", small)
    threads = torch.get_num_threads()
    try:
        rows = speed.main(["--configs", "small", "--threads", "1,2", "--reps", "2"])
    finally:
        torch.set_num_threads(threads)
    assert [(r["threads"], r["setting"]) for r in rows[::5]] == [(1, "sentence"), (1, "segment48"),
                                                                 (2, "sentence"), (2, "segment48")]
    assert [r["model"] for r in rows[:5]] == ["transformer", "softmax", "reluformer", "rela", "softmax_copy"]
    assert {r["clock"] for r in rows if r["threads"] == 1} == {"cpu"}
    for r in rows:
        assert len(r["times_s"]) == 2
        assert ("ratio" in r) == (r["model"] != "transformer")
        assert ("vs_softmax" in r) == (r["model"] not in ("transformer", "softmax"))
    summary = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SUMMARY ")]
    assert len(summary) == 1 and "noise check: softmax copy" in summary[0] and "8 rows" in summary[0]
    with pytest.raises(SystemExit):
        speed.main(["--configs", "nonesuch"])


def load_decoding_speed():
    import importlib.util

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("benchmarks_decoding_speed", REPO / "benchmarks" / "decoding_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decoding_speed_rows_ratios_and_summary(doc_checkpoint, prepared_doc_data, tmp_path, capsys):
    """benchmarks/decoding_speed.py (issue 32): reluformer-translate against fairseq-generate and
    fairseq-interactive on the same checkpoint, the translator's copy as the noise check, every
    ratio paired over the interleaved repetitions, one SUMMARY line (the last)."""
    speed = load_decoding_speed()
    threads = torch.get_num_threads()
    try:
        report = speed.main(["--data", str(prepared_doc_data["doc"]), "--checkpoint", str(doc_checkpoint),
                             "--sentences", "12", "--repeats", "2", "--beam", "2", "--max-len-a", "0", "--max-len-b", "6", "--clock", "cpu",
                             "--json", str(tmp_path / "speed.json")])
    finally:
        torch.set_num_threads(threads)
    assert [r["system"] for r in report["rows"]] == ["reluformer-translate", "fairseq-generate", "fairseq-interactive",
                                                     "reluformer-translate (copy)", "reluformer-translate --alignments"]
    assert 0 < report["sentences"] <= 12
    for row in report["rows"]:
        assert len(row["seconds"]) == 2 and row["sentences_per_s"] > 0
        if row["system"] != "reluformer-translate":
            assert len(row["translate_vs_this"]["per_rep"]) == 2
    printed = capsys.readouterr().out.rstrip().splitlines()
    assert printed[-1] == report["summary"] and printed[-1].startswith("SUMMARY ")
    for part in ("vs fairseq-generate", "vs fairseq-interactive", "noise check: copy", "vs itself with --alignments",
                 "2 interleaved repetitions, cpu clock"):
        assert part in printed[-1], part
    assert json.loads((tmp_path / "speed.json").read_text())["summary"] == report["summary"]


def test_decoding_speed_bad_input(tmp_path, capsys):
    speed = load_decoding_speed()
    with pytest.raises(SystemExit):
        speed.main(["--data", str(tmp_path), "--checkpoint", str(tmp_path / "none.pt")])
    assert "none.pt: no such file" in capsys.readouterr().err
    (tmp_path / "c.pt").write_bytes(b"")
    with pytest.raises(SystemExit):
        speed.main(["--data", str(tmp_path), "--checkpoint", str(tmp_path / "c.pt")])
    assert "not a prepared directory" in capsys.readouterr().err


def test_guided_decoding_measures_the_values_the_tuner_chose(tmp_path):
    """--tuned: each mode decodes with what reluformer-memory tune chose (the pieces' weight and
    floor, the per-input read-out and search), not the benchmark's fixed values; the corpus
    datastore brings its own tuned values, so kNN-MT gets the datastore alone."""
    guided = load_benchmark_script("guided_decoding")
    report = {"chosen": {"pieces": {"pieces_weight": 5.0, "pieces_floor": 0.0, "pieces_length_cap": 1.5, "s_bleu": 19.2,
                                    "decode": "p"},
                         "per_input": {"options": {"k": 256, "lam": 1.0, "temperature": 5.7, "radius": 5.7,
                                                   "readout": "softmax", "adaptive": False},
                                       "search": {"chosen": {"knn_batched_search": True}}}}}
    (tmp_path / "tune.json").write_text(json.dumps(report))
    args = guided.parse(["--checkpoint", "c.pt", "--data", "d", "--tuned", str(tmp_path / "tune.json")])
    systems = guided.systems_of(args, "store")
    assert systems["knn"][1] == {"knn": "store"}
    assert systems["pieces"][1] == {"pieces_weight": 5.0, "pieces_floor": 0.0, "pieces_length_cap": 1.5, "pieces_k": 8}
    per_input = systems["knn-per-input"][1]
    assert per_input["knn_memory"] and per_input["knn_k"] == 256 and per_input["knn_temperature"] == 5.7
    assert per_input["knn_batched_search"] is True
    fixed = guided.systems_of(guided.parse(["--checkpoint", "c.pt", "--data", "d"]), "store")
    assert fixed["knn"][1]["knn_k"] == 16 and fixed["pieces"][1]["pieces_weight"] == 10.0
