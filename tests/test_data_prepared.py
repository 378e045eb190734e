"""``prepared.json``'s one owner (:mod:`reluformer_mt.data.prepared`) and the one ``--spm-model`` syntax."""
import json
import re

import pytest

from reluformer_mt.data.prepared import Prepared, PreparedError, SplitInfo, parse_spm_models

# what reluformer-prepare has written since the first version (keys and order)
OLD_MANIFEST = {
    "created_by": "reluformer-prepare", "format": "docmt", "src_lang": "en", "tgt_lang": "de", "segment_tokens": 128,
    "level": "document", "separator": "<sep>", "spm_model": "spm.model", "spm_model_src": "spm.model",
    "spm_model_tgt": "spm.model", "joined_dictionary": True, "max_source_positions": 191, "max_target_positions": 219,
    "splits": {"train": {"documents": 6, "sentences": 553, "segments": 249, "source_tokens": 22331, "target_tokens": 24744,
                         "longest_source": 178, "longest_target": 218, "overlong_sentences": 12,
                         "overlong_examples": ["document dev.1 (1)"]}},
    "extras": [], "counts": {"train: documents in": 6}, "repaired": {}, "skipped": {}, "warnings": {},
    "options": {"out": "x", "segment_tokens": 128},
}


def write(directory, manifest) -> None:
    (directory / "prepared.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")


def test_an_existing_manifest_loads_and_writes_back_byte_for_byte(tmp_path):
    write(tmp_path, OLD_MANIFEST)
    p = Prepared.load(tmp_path)
    assert (p.src_lang, p.tgt_lang, p.segment_tokens, p.level, p.separator) == ("en", "de", 128, "document", "<sep>")
    assert p.joint_spm and p.spm_paths() == (tmp_path / "spm.model", tmp_path / "spm.model")
    assert p.positions == 219 and p.splits["train"] == SplitInfo(6, 553, 249, 22331, 24744, 178, 218, 12, ("document dev.1 (1)",))
    before = (tmp_path / "prepared.json").read_text(encoding="utf-8")
    p.write(tmp_path)
    assert (tmp_path / "prepared.json").read_text(encoding="utf-8") == before
    assert Prepared.load(tmp_path) == p


def test_sentence_level_and_older_forms(tmp_path):
    # sentence level is segment_tokens 0 in the file, None in the dataclass, and written back as 0
    write(tmp_path, {**OLD_MANIFEST, "segment_tokens": 0, "level": "sentence"})
    p = Prepared.load(tmp_path)
    assert p.segment_tokens is None and p.level == "sentence" and p.to_json()["segment_tokens"] == 0
    # a minimal manifest: one joint 'spm_model', no split counts, no positions; level without segment_tokens
    write(tmp_path, {"src_lang": "en", "tgt_lang": "de", "level": "sentence", "spm_model": "spm.model"})
    p = Prepared.load(tmp_path)
    assert (p.segment_tokens, p.spm_src, p.spm_tgt, p.separator, p.splits, p.positions) == (None, "spm.model", "spm.model", "<sep>", {}, 0)
    # per-language models
    write(tmp_path, {**OLD_MANIFEST, "spm_model": None, "spm_model_src": "spm.en.model", "spm_model_tgt": "spm.de.model"})
    p = Prepared.load(tmp_path)
    assert not p.joint_spm and p.to_json()["spm_model"] is None and p.spm_paths()[1].name == "spm.de.model"


@pytest.mark.parametrize("edit, pattern", [
    (lambda m: m.pop("src_lang"), r"field 'src_lang' is missing"),
    (lambda m: m.update(tgt_lang=3), r"field 'tgt_lang': expected str, got 3"),
    (lambda m: m.update(segment_tokens="big"), r"field 'segment_tokens': expected an integer >= 0 \(0 = sentence level\), got 'big'"),
    (lambda m: m.update(segment_tokens=-1), r"field 'segment_tokens': expected an integer >= 0"),
    (lambda m: (m.pop("segment_tokens"), m.pop("level")), r"field 'segment_tokens' is missing"),
    (lambda m: m.update(spm_model=None, spm_model_src=None), r"field 'spm_model_src'/'spm_model_tgt' \(or 'spm_model'\) is missing"),
    (lambda m: m.update(max_source_positions=0), r"field 'max_source_positions': expected a positive integer, got 0"),
    (lambda m: m.update(splits={"train": {"documents": "six"}}), r"field 'splits.train.documents': expected an integer, got 'six'"),
    (lambda m: m.update(splits=[1]), r"field 'splits': expected dict"),
])
def test_bad_fields_are_one_line_errors_naming_file_and_field(tmp_path, edit, pattern):
    manifest = json.loads(json.dumps(OLD_MANIFEST))
    edit(manifest)
    write(tmp_path, manifest)
    with pytest.raises(PreparedError) as e:
        Prepared.load(tmp_path)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{tmp_path / 'prepared.json'}: ")
    assert re.search(pattern, str(e.value)), str(e.value)


def test_unreadable_files_are_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"prepared.json: not found; prepare the directory with reluformer-prepare"):
        Prepared.load(tmp_path)
    assert Prepared.load_if_present(tmp_path) is None and not Prepared.exists(tmp_path)
    (tmp_path / "prepared.json").write_text('{"src_lang": "en",\n', encoding="utf-8")
    with pytest.raises(PreparedError, match=r"prepared.json: not valid JSON \(") as e:
        Prepared.load(tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "prepared.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(PreparedError, match=r"prepared.json: expected a JSON object, got list"):
        Prepared.load(tmp_path)


def test_sentencepiece_names_a_missing_model(tmp_path):
    write(tmp_path, OLD_MANIFEST)
    with pytest.raises(FileNotFoundError, match=r"spm.model: SentencePiece model not found"):
        Prepared.load(tmp_path).sentencepiece()


# ---------------------------------------------------------------------------------------------- --spm-model

def test_one_spm_model_syntax():
    assert parse_spm_models("a.model") == ("a.model",)
    assert parse_spm_models("src.model,tgt.model") == ("src.model", "tgt.model")
    assert parse_spm_models(["src.model", "tgt.model"]) == ("src.model", "tgt.model")  # the Python API, the old form
    assert parse_spm_models(["src.model,tgt.model"]) == ("src.model", "tgt.model")
    assert parse_spm_models(None) == () == parse_spm_models([]) == parse_spm_models("")
    for bad in ("a,b,c", "a,", ["a", "b", "c"]):
        with pytest.raises(ValueError, match=r"^--spm-model: expected MODEL \(joint\) or SRC_MODEL,TGT_MODEL, got"):
            parse_spm_models(bad)


def _parsers():
    from reluformer_mt.cli import eval as eval_cli
    from reluformer_mt.cli import prepare as prepare_cli
    from reluformer_mt.cli import translate as translate_cli

    return {"prepare": (prepare_cli.build_parser(), ["--out", "o"]),
            "translate": (translate_cli.build_parser(), ["-c", "x.pt"]),
            "eval align": (eval_cli.build_parser(), ["align", "--checkpoint", "x.pt"]),
            "eval contrastive": (eval_cli.build_parser(), ["contrastive", "--checkpoint", "x.pt", "--suite", "contrapro",
                                                           "--suite-dir", "d"])}


@pytest.mark.parametrize("tool", ["prepare", "translate", "eval align", "eval contrastive"])
def test_every_cli_parses_spm_model_alike(tool, capsys):
    parser, required = _parsers()[tool]
    assert parser.parse_args(required + ["--spm-model", "a.model"]).spm_model == ("a.model",)
    assert parser.parse_args(required + ["--spm-model", "s.model,t.model"]).spm_model == ("s.model", "t.model")
    assert capsys.readouterr().err == ""
    # the old space-separated form still works, with a one-line note
    assert parser.parse_args(required + ["--spm-model", "s.model", "t.model"]).spm_model == ("s.model", "t.model")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'--spm-model s.model t.model' is deprecated; write --spm-model s.model,t.model" in err
    with pytest.raises(SystemExit) as e:
        parser.parse_args(required + ["--spm-model", "a,b,c"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: --spm-model: expected MODEL (joint) or SRC_MODEL,TGT_MODEL, got 'a,b,c'" in err


@pytest.mark.parametrize("tool", ["prepare", "translate"])
def test_segment_tokens_option_is_parsed_once(tool, capsys):
    parser, required = _parsers()[tool]
    assert parser.parse_args(required + ["--segment-tokens", "sentence"]).segment_tokens == 0
    assert parser.parse_args(required + ["--segment-tokens", "512"]).segment_tokens == 512
    with pytest.raises(SystemExit):
        parser.parse_args(required + ["--segment-tokens", "big"])
    assert "--segment-tokens" in capsys.readouterr().err
