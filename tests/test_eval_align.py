"""``reluformer-eval align`` and ``attn-stats`` on a tiny trained ReLUFormer (conftest's
``trained_checkpoint``: en->de, word level, 1 layer, 2 heads), checked against attention
obtained by an independent forward (fairseq's ``alignment_layer``/``alignment_heads`` path)."""
import json
import math

import pytest
import torch

from reluformer_mt.cli.eval import main
from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation import extract
from reluformer_mt.evaluation.stats import AttentionStats, alignment_from_attention, sentencepiece_word_map, shift_rows

N_PAIRS = 30


@pytest.fixture(scope="module")
def texts(sentence_data, tmp_path_factory):
    """The first N_PAIRS test pairs as token files (one sentence a line)."""
    d = tmp_path_factory.mktemp("align_texts")
    src = (sentence_data["raw"] / "test.en").read_text(encoding="utf-8").splitlines()[:N_PAIRS]
    tgt = (sentence_data["raw"] / "test.de").read_text(encoding="utf-8").splitlines()[:N_PAIRS]
    (d / "src.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (d / "tgt.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return {"dir": d, "src": d / "src.txt", "tgt": d / "tgt.txt",
            "words": [(s.split(), t.split()) for s, t in zip(src, tgt)]}


@pytest.fixture(scope="module")
def direct(trained_checkpoint, texts):
    """Per-pair cross-attention of layer 1, heads (2, T, S), from a separate one-sentence forward:
    fairseq's decoder returns the mean of the first ``alignment_heads`` heads of ``alignment_layer``."""
    loaded = extract.load_checkpoint(trained_checkpoint)
    model, sd, td = loaded.model, loaded.src_dict, loaded.tgt_dict
    out = []
    with torch.no_grad():
        for s_words, t_words in texts["words"]:
            src = torch.tensor([[sd.index(w) for w in s_words] + [sd.eos()]])
            tgt = [td.index(w) for w in t_words] + [td.eos()]
            prev = torch.tensor([[td.eos()] + tgt[:-1]])
            lengths = torch.tensor([src.shape[1]])
            head0 = model(src, lengths, prev, alignment_layer=0, alignment_heads=1)[1]["attn"][0][0]
            mean2 = model(src, lengths, prev, alignment_layer=0, alignment_heads=2)[1]["attn"][0][0]
            out.append(torch.stack([head0, 2 * mean2 - head0]).double())
    return out


def word_ids(n: int):
    return list(range(n)) + [-1]  # word level: token j is word j; </s> belongs to no word


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def read_links(path):
    return [s for s in aer_lib.read_predictions(path)]


def assert_same_links(predicted, attn, src_n, tgt_n, line):
    """Links equal a direct computation; a difference is allowed only at a near tie (the batched
    and single forwards differ by ~1e-7)."""
    expected = set(alignment_from_attention(attn, word_ids(src_n), word_ids(tgt_n)))
    if predicted == expected:
        return
    for i, j in predicted ^ expected:
        row = attn[j, :src_n]
        top = row.topk(min(2, src_n)).values
        assert len(top) == 2 and float(top[0] - top[1]) < 1e-5, f"line {line}: link {i}-{j} differs, no near tie"


def test_captured_weights_equal_an_independent_forward(trained_checkpoint, texts, direct):
    loaded = extract.load_checkpoint(trained_checkpoint)
    pairs = extract.encode_pairs(loaded, [s for s, _ in texts["words"]], [t for _, t in texts["words"]])
    got = extract.attention_of_pairs(loaded, pairs, ("cross", "decoder_self"), max_tokens=150)  # several batches
    for k, (a, (s, t)) in enumerate(zip(got, texts["words"])):
        assert a["cross"].shape == (1, 2, len(t) + 1, len(s) + 1)
        torch.testing.assert_close(a["cross"][0].double(), direct[k], atol=1e-5, rtol=0)
        upper = torch.triu(torch.ones(len(t) + 1, len(t) + 1, dtype=torch.bool), 1)
        assert (a["decoder_self"][0][:, upper] == 0).all()  # causal: no weight on future tokens


def test_align_links_inside_bounds_and_equal_direct_computation(trained_checkpoint, texts, direct, tmp_path, capsys):
    from reluformer_mt.evaluation.align import induce_links

    loaded = extract.load_checkpoint(trained_checkpoint)
    pairs = extract.encode_pairs(loaded, [s for s, _ in texts["words"]], [t for _, t in texts["words"]])
    ml = induce_links(loaded, pairs, max_tokens=150)
    variants = {(head, mode): ml.get(mode, 0, None if head == "average" else int(head) - 1)
                for head in ("1", "2", "average") for mode in ("normal", "shifted")}
    # the command line selects the same links and writes them one line per pair
    out = tmp_path / "pred.align"
    rc, _, err = run(["align", "--checkpoint", trained_checkpoint, "--src", texts["src"], "--tgt", texts["tgt"],
                      "--layer", "1", "--head", "2", "--shifted", "--output", out], capsys)
    assert rc == 0, err
    assert read_links(out) == variants["2", "shifted"]
    for (head, mode), links in variants.items():
        assert len(links) == N_PAIRS
        for k, (ls, (s, t)) in enumerate(zip(links, texts["words"])):
            assert all(0 <= i < len(s) and 0 <= j < len(t) for i, j in ls), f"line {k + 1}: {sorted(ls)}"
            assert len({j for _, j in ls}) == len(ls)  # at most one link per target word
            attn = direct[k].mean(0) if head == "average" else direct[k][int(head) - 1]
            if mode == "shifted":
                attn = shift_rows(attn)
            assert_same_links(ls, attn, len(s), len(t), k + 1)
    assert variants["average", "normal"] != variants["average", "shifted"]  # shifting changes links


def test_layer_all_writes_a_file_per_layer(trained_checkpoint, texts, tmp_path, capsys):
    rc, out, err = run(["align", "--checkpoint", trained_checkpoint, "--pairs", _pairs_file(texts, tmp_path),
                        "--output", tmp_path / "pred.align"], capsys)
    assert rc == 0, err
    assert (tmp_path / "pred.layer1.align").is_file()
    assert len((tmp_path / "pred.layer1.align").read_text().splitlines()) == N_PAIRS


def _pairs_file(texts, tmp_path):
    path = tmp_path / "pairs.src-tgt"
    path.write_text("".join(f"{' '.join(s)} ||| {' '.join(t)}\n" for s, t in texts["words"]), encoding="utf-8")
    return path


def _gold(texts, path, base=1, swap=False):
    """A small gold file: diagonal sure links, every third one possible (mark 'p')."""
    lines = []
    for s, t in texts["words"]:
        links = []
        for j in range(len(t)):
            i = min(len(s) - 1, j * len(s) // len(t))
            a, b = (j, i) if swap else (i, j)
            links.append(f"{a + base}{'p' if j % 3 == 2 else '-'}{b + base}")
        lines.append(" ".join(links))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_aer_table_against_gold(trained_checkpoint, texts, tmp_path, capsys):
    gold = _gold(texts, tmp_path / "gold.txt")
    pred = tmp_path / "pred.align"
    rc, out, err = run(["align", "--checkpoint", trained_checkpoint, "--src", texts["src"], "--tgt", texts["tgt"],
                        "--layer", "1", "--output", pred, "--gold", gold, "--gold-base", "1",
                        "--plot", tmp_path / "aer.png", "--json", tmp_path / "align.json"], capsys)
    assert rc == 0, err
    assert "AER per layer" in out and "shifted head avg" in out
    assert (tmp_path / "aer.png").stat().st_size > 0
    report = json.loads((tmp_path / "align.json").read_text())
    entry = report["models"][trained_checkpoint.parent.name]
    expected = aer_lib.corpus_aer(aer_lib.read_predictions(pred), aer_lib.read_gold(gold, 1, "p"))
    assert entry["selected"][0]["aer"]["aer"] == pytest.approx(expected.aer)
    table = entry["aer_per_layer"]
    assert table["normal"]["head_average"][0] == pytest.approx(expected.aer)
    for mode in ("normal", "shifted"):
        per_head = table[mode]["per_head"][0]
        assert table[mode]["best_head"][0] == pytest.approx(min(per_head))
        assert 0 <= min(per_head) <= 1
    # the same gold written target-first, read with --gold-swap, scores the same
    swapped = _gold(texts, tmp_path / "gold.swapped", base=0, swap=True)
    rc, out, err = run(["align", "--checkpoint", trained_checkpoint, "--src", texts["src"], "--tgt", texts["tgt"],
                        "--layer", "1", "--gold", swapped, "--gold-base", "0", "--gold-swap",
                        "--json", tmp_path / "swapped.json"], capsys)
    assert rc == 0, err
    again = json.loads((tmp_path / "swapped.json").read_text())["models"][trained_checkpoint.parent.name]
    assert again["selected"][0]["aer"]["aer"] == pytest.approx(expected.aer)


def test_attn_stats_equal_direct_computation(trained_checkpoint, texts, direct, tmp_path, capsys):
    rc, out, err = run(["attn-stats", "--checkpoint", trained_checkpoint, "--src", texts["src"], "--tgt", texts["tgt"],
                        "--max-tokens", "200", "--json", tmp_path / "stats.json", "--plot", tmp_path / "sp.png"], capsys)
    assert rc == 0, err
    stats = json.loads((tmp_path / "stats.json").read_text())["models"][trained_checkpoint.parent.name]["stats"]
    assert set(stats) == {"encoder_self", "decoder_self", "cross"}
    for kind, res in stats.items():
        for name in ("sparsity", "null_rate", "top_score_ratio", "head_diversity"):
            assert all(0 <= v <= 1 for v in res["per_layer"][name]), (kind, name)
        assert all(0 <= v <= math.log(60) for v in res["per_layer"]["entropy"])
    acc = AttentionStats()
    for attn in direct:
        acc.update(attn[None].float())  # (1 layer, 2 heads, T, S), cropped: no mask needed
    want = acc.result()
    cross = stats["cross"]
    for name in ("sparsity", "null_rate", "entropy", "top_score_ratio"):
        assert cross["per_head"][name][0] == pytest.approx(want[name][0].tolist(), abs=1e-3), name
    assert cross["per_layer"]["head_diversity"][0] == pytest.approx(float(want["head_diversity"][0]), abs=1e-4)
    assert (tmp_path / "sp.png").stat().st_size > 0


def test_attn_stats_on_binarised_split_and_side_by_side(trained_checkpoint, sentence_data, texts, tmp_path, capsys):
    """The binarised test split gives the text files' numbers; two checkpoints print side by side."""
    rc, out, err = run(["attn-stats", "--checkpoint", trained_checkpoint, trained_checkpoint, "--names", "a", "b",
                        "--data", sentence_data["bin"], "--split", "test", "--limit", N_PAIRS, "--kinds", "cross",
                        "--json", tmp_path / "split.json"], capsys)
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("1 ")]
    assert [r[1] for r in rows] == ["a", "b"] and rows[0][2:] == rows[1][2:]  # layer 1 of both models, adjacent
    split = json.loads((tmp_path / "split.json").read_text())["models"]
    rc, _, err = run(["attn-stats", "--checkpoint", trained_checkpoint, "--src", texts["src"], "--tgt", texts["tgt"],
                      "--kinds", "cross", "--json", tmp_path / "text.json"], capsys)
    assert rc == 0, err
    text = json.loads((tmp_path / "text.json").read_text())["models"][trained_checkpoint.parent.name]
    assert split["a"]["examples"] == N_PAIRS
    assert split["a"]["stats"]["cross"]["all"] == pytest.approx(text["stats"]["cross"]["all"], abs=1e-5)
    assert split["a"]["stats"] == split["b"]["stats"]


def test_sentencepiece_words(tmp_path, sentence_data):
    """Pieces of a SentencePiece data dir (prepared.json) map back to the words of the line."""
    import sentencepiece as spm
    from fairseq.data import Dictionary

    from reluformer_mt.data.prepared import Prepared

    lines = (sentence_data["raw"] / "train.en").read_text(encoding="utf-8").splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "spm"), vocab_size=300,
                                   user_defined_symbols=["<sep>"], hard_vocab_limit=False, minloglevel=2)
    Prepared(src_lang="en", tgt_lang="de", segment_tokens=None, spm_src="spm.model", spm_tgt="spm.model").write(tmp_path)
    sp_src, sp_tgt = Prepared.load(tmp_path).sentencepiece()
    assert sp_src is sp_tgt  # a joint model is loaded once
    d = Dictionary()
    for i in range(sp_src.get_piece_size()):
        d.add_symbol(sp_src.id_to_piece(i))
    words = "the unbelievably long word , said she".split()
    ids, word_of = extract.encode_words(words, d, sp_src)
    pieces = [d[i] for i in ids]
    assert len(ids) > len(words) and word_of[-1] == -1 and pieces[-1] == "</s>"
    assert word_of == sentencepiece_word_map(pieces)
    assert "".join(pieces[:-1]).replace("\u2581", " ").split() == words


@pytest.mark.parametrize("case, expected", [
    ("missing_gold_line", "has 29 lines but the input has 30"),
    ("mismatched_lines", "has 30 lines but"),
    ("malformed_link", "malformed link '1-x'"),
    ("out_of_range", "out of range"),
    ("no_checkpoint", "checkpoint not found"),
    ("no_gold_base", "--gold needs --gold-base"),
])
def test_bad_input_is_a_one_line_error(case, expected, trained_checkpoint, texts, tmp_path, capsys):
    gold = _gold(texts, tmp_path / "gold.txt", base=0)
    lines = gold.read_text().splitlines()
    src, tgt, ckpt = texts["src"], texts["tgt"], trained_checkpoint
    extra = ["--gold-base", "0"]
    if case == "missing_gold_line":
        gold.write_text("\n".join(lines[:-1]) + "\n")
    elif case == "mismatched_lines":
        tgt = tmp_path / "short.tgt"
        tgt.write_text("\n".join(texts["tgt"].read_text().splitlines()[:-1]) + "\n")
    elif case == "malformed_link":
        gold.write_text("\n".join(["0-0 1-x"] + lines[1:]) + "\n")
    elif case == "out_of_range":
        gold.write_text("\n".join(["0-0 99-0"] + lines[1:]) + "\n")
    elif case == "no_checkpoint":
        ckpt = tmp_path / "missing" / "checkpoint_best.pt"
    elif case == "no_gold_base":
        extra = []
    rc, out, err = run(["align", "--checkpoint", ckpt, "--src", src, "--tgt", tgt, "--gold", gold] + extra, capsys)
    assert rc == 2  # an input error
    assert err.count("\n") == 1 and err.startswith("reluformer-eval align: error:"), err
    assert expected in err, err
