"""What TM-first writes: a match's target becomes an output line only when it can be one (no NUL or
other control character, no reserved separator, not a document marker, which reads back as a
document break); a copied sentence has no model score (nan in the n-best list and in --scores,
never an invented 0.0000) and keeps the model's hypotheses as its n-best alternatives."""
import pytest

from helpers import needs_shared_data
from test_translate import translate_main

SOURCES = ["thank you very much .", "i would like to tell you a story .", "this is my life .", "we have a problem ."]
TARGETS = ["vielen\x00dank .", "<d>", "ich <sep> erzähle", "wir haben ein problem ."]


def memory_and_input(tmp_path):
    memory = tmp_path / "memory.tsv"
    memory.write_text("".join(f"{s}\t{t}\n" for s, t in zip(SOURCES, TARGETS)), encoding="utf-8")
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    return memory, source


@needs_shared_data
def test_tm_first_copies_only_targets_that_can_be_output_lines(doc_checkpoint, tmp_path, capsys):
    memory, source = memory_and_input(tmp_path)
    out, scores = tmp_path / "out.txt", tmp_path / "scores.txt"
    code, err = translate_main(["--checkpoint", doc_checkpoint, "--input", source, "--output", out, "--memory", memory,
                                "--tm-first", "0.9", "--scores", scores, "--beam", "2", "--max-len-a", "0",
                                "--max-len-b", "6", "--no-progress", "--segment-tokens", "0"], capsys)
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 4 and lines[3] == TARGETS[3]
    assert not any("\x00" in line or "<sep>" in line or line.strip() == "<d>" for line in lines)
    assert "TM-first: matches left to the model (a control character, the separator or a document marker in " \
           "their target): 3" in err
    score_lines = scores.read_text(encoding="utf-8").split("\n")[:-1]
    assert score_lines[3] == "nan" and all(float(s) <= 0 for s in score_lines[:3])


@needs_shared_data
def test_a_tm_first_copy_has_no_invented_score_in_the_nbest_list(doc_checkpoint, tmp_path, capsys):
    memory, source = memory_and_input(tmp_path)
    out = tmp_path / "nbest.txt"
    code, err = translate_main(["--checkpoint", doc_checkpoint, "--input", source, "--output", out, "--memory", memory,
                                "--tm-first", "0.9", "--nbest", "2", "--beam", "2", "--max-len-a", "0",
                                "--max-len-b", "6", "--no-progress", "--segment-tokens", "0"], capsys)
    assert code == 0, err
    rows = [line.split(" ||| ") for line in out.read_text(encoding="utf-8").splitlines()]
    copied = [row for row in rows if row[0] == "3"]
    assert copied[0][1:] == [TARGETS[3], "nan"]  # the memory's target: no model score
    assert len(copied) == 2 and float(copied[1][2]) <= 0  # the model's best hypothesis follows, with its score
    assert all(row[2] != "nan" for row in rows if row[0] != "3")


def test_match_score_with_memory_none_is_refused_before_loading(tmp_path, capsys):
    """--match-score ranks the memory's matches: with --memory none it was accepted and ignored."""
    from test_hardening_outputs_and_rekeying import one_line

    from reluformer_mt.guidance import TranslationError
    from reluformer_mt.inference.options import MemoryOptions

    source = tmp_path / "in.txt"
    source.write_text("a b c\n", encoding="utf-8")
    code, err = translate_main(["--checkpoint", tmp_path / "missing.pt", "--input", source, "--memory", "none",
                                "--match-score", "words"], capsys)
    one_line(code, err, r"--match-score words: ranks the memory's matches, which --memory none withholds")
    with pytest.raises(TranslationError, match="--match-score words: ranks the memory's matches, which --memory none"):
        MemoryOptions(memory="none", match_score="words")


def test_the_demos_and_tuners_tm_first_follow_the_translators_rule():
    """memory_first (the demo's TM-first column, the tuner's threshold) copies what the translator
    copies: not a target holding a NUL, the separator, or a bare document marker."""
    from reluformer_mt.memory.tm import copyable_target, memory_first

    outputs = [f"model {i}" for i in range(len(TARGETS))]
    assert memory_first(outputs, TARGETS, [1.0] * len(TARGETS), 0.9) == outputs[:3] + [TARGETS[3]]
    assert copyable_target("a\tb") and not copyable_target(" \u200b<d> ") and not copyable_target("line\nbreak")
