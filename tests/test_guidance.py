"""Decoding guidance as parts (reluformer_mt.inference.guidance): a new kind is one file -- its
options dataclass, its part and one register_guidance call -- and both reluformer-translate's
DocumentTranslator and fairseq-generate (the task's build_generator) use it. Here the file is this
test's toy kind, a part that bans one target token."""
import math
from dataclasses import dataclass

from helpers import USER_DIR, needs_shared_data, run_fairseq
from reluformer_mt.inference.guidance import BeamStep, Guidance, GuidanceContext, TranslationError, register_guidance


# ------------------------------------------------------------------ the toy kind: one file's worth

@dataclass(frozen=True)
class BanToken:
    """``token``: a target dictionary entry the output never holds."""
    token: str = ""

    def __post_init__(self):
        if not self.token:
            raise TranslationError("ban: give the token to ban")


class BannedToken(Guidance):
    stage = "constraint"

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def apply(self, step: BeamStep) -> None:
        step.lprobs[:, self.index] = -math.inf
        self.stats["ban: beam steps"] += step.lprobs.size(0)

    def describe(self) -> str:
        return f"token {self.index} banned"


def build_ban(options: BanToken, context: GuidanceContext):
    index = context.tgt_dict.index(options.token)
    return None if index == context.tgt_dict.unk() else BannedToken(index)


register_guidance("ban", BanToken, build_ban)  # the one registration


# ------------------------------------------------------------------ used through both paths

def _most_frequent_token(lines, skip=("<sep>",)):
    counts = {}
    for line in lines:
        for t in line.split():
            if t not in skip:
                counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


@needs_shared_data
def test_a_new_kind_of_guidance_works_in_the_translator_and_in_fairseq_generate(doc_checkpoint, prepared_doc_data):
    from reluformer_mt.inference import DocumentTranslator

    documents = [["Thank you very much.", "I would like to tell you a story."], ["This is the second document."]]
    kwargs = dict(device="cpu", beam=2, max_len_a=0, max_len_b=8)
    plain = DocumentTranslator(doc_checkpoint, **kwargs)
    pieces = [" ".join(plain.sp_tgt.encode(r.text, out_type=str)) for d in plain.translate(documents) for r in d]
    token = _most_frequent_token(pieces)
    banned = DocumentTranslator(doc_checkpoint, guidance=[BanToken(token)], **kwargs)
    assert [type(p).__name__ for p in banned.guidance] == ["SeparatorConstraint", "BannedToken"]  # constraints last
    sources = [banned._source_ids(banned._expand(banned._encode([d]))[0], seg)[0]
               for d in documents for seg in banned._segments(banned._expand(banned._encode([d]))[0])]
    for hyp in banned.generate(sources):
        assert banned.tgt_dict.index(token) not in hyp["tokens"].tolist()
    banned.translate(documents)
    assert banned.stats["ban: beam steps"] > 0 and "banned" in banned.describe()

    # fairseq-generate: --guidance NAME:option=value names the same registered kind
    common = [prepared_doc_data["doc"], "--user-dir", USER_DIR, "--task", "document_translation", "--path",
              doc_checkpoint, "--gen-subset", "valid", "--beam", "2", "--max-len-a", "0", "--max-len-b", "8",
              "--max-sentences", "8", "--cpu", "--no-progress-bar"]
    def hypotheses(extra):
        printed = run_fairseq("generate", common + extra, capture=True)
        return [line.split("\t")[2].split() for line in printed.splitlines() if line.startswith("H-")]

    plain_hyps = hypotheses([])
    generated = _most_frequent_token(" ".join(h) for h in plain_hyps)
    banned_hyps = hypotheses(["--guidance", f"ban:token={generated}"])
    assert len(banned_hyps) == len(plain_hyps) and any(generated in h for h in plain_hyps)
    assert not any(generated in h for h in banned_hyps)


def test_guidance_specs_are_checked_by_their_kind():
    import pytest

    from reluformer_mt.inference.guidance import parse_guidance

    assert parse_guidance("ban:token=x") == [BanToken("x")]
    with pytest.raises(TranslationError, match="no kind of guidance 'bann'"):
        parse_guidance("bann:token=x")
    with pytest.raises(TranslationError, match="--guidance ban: no option 'tok'"):
        parse_guidance("ban:tok=x")
    with pytest.raises(TranslationError, match="ban: give the token"):
        parse_guidance("ban")
