"""Decoding guidance as parts (reluformer_mt.guidance): a new kind is one file -- its
options dataclass, its part and one register_guidance call -- and reluformer-translate's command
line (``--ban-token``), DocumentTranslator (``ban_token=``, or the options object) and
fairseq-generate (``--guidance ban:token=...``) all use it, with no other file edited. Here the
file is this test's toy kind, a part that bans one target token."""
import math
from dataclasses import dataclass
from typing import Optional

from helpers import USER_DIR, needs_shared_data, run_fairseq
from reluformer_mt.guidance import BeamStep, Guidance, GuidanceContext, TranslationError, register_guidance
from reluformer_mt.guidance.declared import option


# ------------------------------------------------------------------ the toy kind: one file's worth

@dataclass(frozen=True)
class BanToken:
    """banning a token (the tests' toy kind of guidance)"""
    token: Optional[str] = option(None, "a target dictionary entry the output never holds (default: none)",
                                  metavar="TOKEN")

    def __post_init__(self):
        if self.token is not None and not self.token:
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
    index = context.tgt_dict.unk() if options.token is None else context.tgt_dict.index(options.token)
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
    by_keyword = DocumentTranslator(doc_checkpoint, ban_token=token, **kwargs)  # the Python API's keyword
    assert by_keyword.translate_text(documents) == banned.translate_text(documents)
    assert plain.translate_text(documents) != banned.translate_text(documents)

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
    # the guidance inside fairseq's own sampling search: sampled, and the token still banned
    sampled = hypotheses(["--guidance", f"ban:token={generated}", "--sampling", "--sampling-topk", "5", "--seed", "3",
                          "--nbest", "2"])[::2]  # each sentence's first sample
    assert len(sampled) == len(plain_hyps) and sampled != banned_hyps
    assert not any(generated in h for h in sampled)


@needs_shared_data
def test_a_new_kind_of_guidance_is_an_option_of_the_command_line(doc_checkpoint, tmp_path, capsys):
    """The toy kind's field is reluformer-translate's --ban-token, with its help, and bans the token."""
    from reluformer_mt.cli.translate import build_parser, main
    from reluformer_mt.inference import DocumentTranslator

    assert "a target dictionary entry the output never holds" in build_parser().format_help()
    source = tmp_path / "in.en"
    source.write_text("Thank you very much.\nI would like to tell you a story.\n\nThis is the second document.\n",
                      encoding="utf-8")
    common = ["-c", doc_checkpoint, "-i", source, "--device", "cpu", "--beam", "2", "--max-len-a", "0",
              "--max-len-b", "8", "--no-progress"]
    assert main([str(a) for a in common + ["-o", tmp_path / "plain.de"]]) == 0
    plain = (tmp_path / "plain.de").read_text(encoding="utf-8")
    sp = DocumentTranslator(doc_checkpoint, device="cpu").sp_tgt
    token = _most_frequent_token(" ".join(sp.encode(line, out_type=str)) for line in plain.splitlines())
    capsys.readouterr()
    assert main([str(a) for a in common + ["-o", tmp_path / "banned.de", "--ban-token", token]]) == 0
    err = capsys.readouterr().err
    assert "banned" in err and "ban: beam steps" in err, err  # its description and its count in the summary
    assert (tmp_path / "banned.de").read_text(encoding="utf-8") != plain


def _guided_generator(translator, spec: str, **search):
    """The task's generator with ``--guidance spec`` and fairseq's search options ``search``."""
    import argparse

    translator.task.cfg.guidance = spec
    args = argparse.Namespace(beam=4, lenpen=1.0, max_len_a=0, max_len_b=8, min_len=1, unkpen=0.0, temperature=1.0,
                              no_repeat_ngram_size=0, **search)
    try:
        return translator.task.build_generator(translator.models, args)
    finally:
        translator.task.cfg.guidance = None


@needs_shared_data
def test_guidance_wraps_the_search_fairseq_built(doc_checkpoint):
    """Sampling, lexical constraints and diverse beam search stay what fairseq built, with the
    parts applied before them: the banned token never comes out, a constraint's token always does."""
    import torch
    from fairseq import search
    from fairseq.token_generation_constraints import pack_constraints

    from reluformer_mt.inference import DocumentTranslator

    t = DocumentTranslator(doc_checkpoint, device="cpu", separators="free")
    sources = [torch.tensor([t.src_dict.index(p) for p in t.sp_src.encode(text, out_type=str)] + [t.src_dict.eos()])
               for text in ("Thank you very much.", "I would like to tell you a story.", "This is the second one.")]
    dataset = t.task.build_dataset_for_inference(sources, [len(s) for s in sources])
    sample = dataset.collater([dataset[i] for i in range(len(sources))])
    plain = [h[0]["tokens"].tolist() for h in t.task.inference_step(_guided_generator(t, ""), t.models, sample)]
    banned = _most_frequent_token(" ".join(t.tgt_dict[i] for i in hyp) for hyp in plain)
    wanted = next(i for i in range(t.tgt_dict.nspecial + 20, len(t.tgt_dict))
                  if not any(i in hyp for hyp in plain) and t.tgt_dict[i] != banned)
    cases = [({"sampling": True, "sampling_topk": 8}, search.Sampling, None),
             ({"constraints": "ordered"}, search.LexicallyConstrainedBeamSearch,
              pack_constraints([[torch.tensor([wanted])] for _ in sources])),
             ({"diverse_beam_groups": 2, "diverse_beam_strength": 0.5}, search.DiverseBeamSearch, None)]
    for options, kind, constraints in cases:
        generator = _guided_generator(t, f"ban:token={banned}", **options)
        assert type(generator.search).__name__ == "GuidedSearch" and type(generator.search.inner) is kind
        torch.manual_seed(1)
        hyps = [h[0]["tokens"].tolist()
                for h in t.task.inference_step(generator, t.models, sample, constraints=constraints)]
        assert not any(t.tgt_dict.index(banned) in hyp for hyp in hyps), options
        if constraints is not None:
            assert all(wanted in hyp for hyp in hyps), hyps


@needs_shared_data
def test_fairseq_generate_refuses_what_needs_the_memory_in_one_line(doc_checkpoint):
    """fairseq-generate looks up no memory matches: the translation pieces, per-input kNN-MT, a
    restricted search, TM-first and memory reading are refused by name, not quietly left out."""
    import pytest

    from reluformer_mt.inference import DocumentTranslator

    t = DocumentTranslator(doc_checkpoint, device="cpu")
    for spec, says in (("pieces:weight=0.5", "--pieces-weight 0.5: translation pieces come from each sentence's "
                                             "translation memory matches, which only reluformer-translate looks up"),
                       ("knn:memory=true", "--knn-memory: per-input datastores come from each sentence's "),
                       ("knn:datastore=ds,restrict=2", "--knn-restrict 2: the entries it searches come from "),
                       ("tm_first:threshold=0.9", "--tm-first 0.9: the targets it copies come from "),
                       ("memory_reading", "--guidance memory_reading: under fairseq-generate a memory model reads "
                                          "the matches its data directory holds")):
        with pytest.raises(TranslationError) as error:
            _guided_generator(t, spec)
        assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_guidance_specs_are_checked_by_their_kind():
    import pytest

    from reluformer_mt.guidance import parse_guidance

    assert parse_guidance("ban:token=x") == [BanToken("x")]
    with pytest.raises(TranslationError, match="no kind of guidance 'bann'"):
        parse_guidance("bann:token=x")
    with pytest.raises(TranslationError, match="--guidance ban: no option 'tok'"):
        parse_guidance("ban:tok=x")
    assert parse_guidance("ban") == [BanToken()]  # a kind's defaults ask for nothing
    with pytest.raises(TranslationError, match="ban: give the token"):
        parse_guidance("ban:token=")

