"""Contrastive evaluation: does the model prefer the right translation given the context?

Test suites (read from their distributed files, see ``../shared/data/README.md``):

- ContraPro (Müller, Rios, Voita & Sennrich, WMT 2018, "A Large-Scale Test Set for the
  Evaluation of Context-Aware Pronoun Translation in Neural Machine Translation"): English→German
  "it" translated as er / sie / es; ``en.txt`` and ``de.txt`` hold ``context <SEP> sentence`` a
  line, ``sentence_groups.txt`` the 0-based first line of every group and, last, the end; the
  first line of a group is the correct translation, the others contrastive.
- DiscEvalMT (Bawden, Sennrich, Birch & Haddow, NAACL 2018, "Evaluating Discourse Phenomena in
  Neural Machine Translation"): English→French anaphora and lexical choice, 200 pairs each;
  ``{set}.prev.{en,fr}`` (context) and ``{set}.current.{en,fr}`` line-aligned, lines 2k and 2k+1
  are pair k's correct (or "semi-correct") and incorrect translation in the order of the json,
  which is checked line by line and gives the categories.

Scoring (as contextual-mt and ContraPro's scorers do, with this package's document model): each
candidate is force-decoded with its context the way the doc-to-doc model was trained — source
``context <sep> sentence </s>``, decoder forced through ``target-context <sep>`` — and only the
candidate's tokens and the final ``</s>`` are scored. ``context="none"`` queries the same model as
a sentence-level one (``sentence </s>`` → ``candidate </s>``); an empty context also means no
separator, as for the first sentence of a document in training.

An example is correct when the correct candidate scores *strictly* higher than every contrastive
one; a tie counts as wrong. Identical inputs are scored once, so they get bit-identical scores
whatever batch they would have been padded into. Together this makes the DiscEvalMT check exact:
every current sentence appears in mirrored pairs (A right with one context, B right with the
other), so without context a model gets exactly one of each mirror right, i.e. exactly 50 %,
unless A and B tie (reported as ``ties``).

Score: ``sum`` (default) is log p(candidate | source, context), the likelihood the comparison is
about; ``mean`` divides by the candidate's token count (contextual-mt's choice) and can flip a
decision when candidates differ in length (``ihn`` vs ``er``, ``pleines`` vs ``pleins``): a
longer candidate with a lower probability can win on the mean. Both are computed; the report
gives the other score's accuracy and the number of decisions it flips.
"""
import difflib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from reluformer_mt.data.spm import repair_separator_lookalikes
from reluformer_mt.data.textfiles import read_lines
from reluformer_mt.evaluation import extract

SUITES = ("contrapro", "discevalmt")
CONTEXTS = ("previous", "none")
SCORES = ("sum", "mean")
CONTRAPRO_SEP = "<SEP>"  # the suite's own context marker, replaced by the model's separator
SUITE_LANGUAGES = {"contrapro": ("en", "de"), "discevalmt": ("en", "fr")}  # source, target of each suite
DISCEVAL_SETS = OrderedDict([("anaphora", "anaphora.json"), ("lexical_choice", "lexical-choice.json")])

# German third-person forms and the pronoun (gender of the antecedent) they belong to. ``ihm`` and
# ``sein*`` are masculine or neuter, so they never decide (see ``contrapro_pronoun``).
_PRONOUN_OF = {"er": "er", "ihn": "er", "es": "es", "sie": "sie", "ihr": "sie", "ihre": "sie", "ihrem": "sie",
               "ihren": "sie", "ihrer": "sie", "ihres": "sie"}


@dataclass
class Example:
    """One contrastive item; ``candidates[0]`` is the correct translation."""
    source: str
    src_context: str                  # previous source sentence, "" = none
    candidates: List[str]
    tgt_contexts: List[str]           # previous target sentence of each candidate
    set: str                          # "contrapro", "anaphora" or "lexical_choice"
    categories: Dict[str, str] = field(default_factory=dict)  # breakdown -> value, e.g. {"pronoun": "er"}
    where: str = ""                   # file:line of the correct candidate


# ---------------------------------------------------------------------------------------------- readers

def _read_lines(path: Path) -> List[str]:
    return read_lines(path, strip_bom=False, missing="suite file not found")


def _same_length(files: Dict[Path, List[str]]) -> int:
    (first, lines), *rest = files.items()
    for path, other in rest:
        if len(other) != len(lines):
            raise ValueError(f"{path} has {len(other)} lines but {first} has {len(lines)}; the suite files must be line-aligned")
    return len(lines)


def _split_context(line: str, path: Path, n: int) -> Tuple[str, str]:
    if line.count(CONTRAPRO_SEP) != 1:
        raise ValueError(f"{path}:{n}: expected 'context {CONTRAPRO_SEP} sentence', found {line.count(CONTRAPRO_SEP)} "
                         f"{CONTRAPRO_SEP} markers")
    context, sentence = line.split(CONTRAPRO_SEP)
    return context.strip(), sentence.strip()


def read_groups(path: Path, n_lines: int) -> List[Tuple[int, int]]:
    """ContraPro's ``sentence_groups.txt``: 0-based group starts, then the end; -> [(start, end)]."""
    bounds = []
    for n, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        try:
            value = int(line)
        except ValueError:
            raise ValueError(f"{path}:{n}: expected a 0-based line index, got {line!r}") from None
        if not 0 <= value <= n_lines:
            raise ValueError(f"{path}:{n}: line index {value} is out of range (the suite has {n_lines} lines)")
        if bounds and value - bounds[-1][1] < 2:
            raise ValueError(f"{path}:{n}: group starting at {bounds[-1][1]} ends at {value}; a group needs the "
                             f"correct line and at least one contrastive line")
        bounds.append((n, value))
    if len(bounds) < 2 or bounds[0][1] != 0 or bounds[-1][1] != n_lines:
        raise ValueError(f"{path}: expected group starts from 0 and the end {n_lines} on the last line, got "
                         f"{bounds[0][1] if bounds else 'nothing'} .. {bounds[-1][1] if bounds else 'nothing'}")
    return [(a, b) for (_, a), (_, b) in zip(bounds, bounds[1:])]


def _changed_words(a: Sequence[str], b: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Words of ``a`` and of ``b`` outside the blocks the two share: position by position when
    the lengths agree (word substitutions, nearly every case and fast), else difflib's alignment."""
    if len(a) == len(b):
        diff = [(x, y) for x, y in zip(a, b) if x != y]
        return [x for x, _ in diff], [y for _, y in diff]
    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    return ([a[i] for op, i1, i2, _, _ in ops if op != "equal" for i in range(i1, i2)],
            [b[j] for op, _, _, j1, j2 in ops if op != "equal" for j in range(j1, j2)])


def contrapro_pronoun(correct: str, contrastive: Sequence[str]) -> str:
    """The pronoun (er / sie / es) of ContraPro's correct candidate.

    The flattened suite has no labels, so: the words where the correct German sentence differs
    from each contrastive one (lower-cased words aligned by position, or by difflib when the
    lengths differ), in sentence order; the first of them that is a third-person form of one
    gender (er/ihn → er, es → es, sie/ihr/ihre... → sie) names the pronoun. ``ihm`` and ``sein*`` are masculine or neuter and are skipped (the
    generator also swaps unrelated pronouns: "schien ihm, als würde es lebendig" keeps ``ihm`` in
    the masculine variant). On the real suite this gives 4,000 er, 4,000 sie and 4,000 es, the
    balance ContraPro publishes; anything undecided is "other".
    """
    words = lambda s: re.findall(r"\w+", s.lower())  # noqa: E731
    ref, changed = words(correct), []
    for other in contrastive:
        mine, _ = _changed_words(ref, words(other))
        changed += [w for w in mine if w not in changed]
    return next((_PRONOUN_OF[w] for w in changed if w in _PRONOUN_OF), "other")


def read_contrapro(suite_dir, limit: Optional[int] = None) -> List[Example]:
    """ContraPro examples (``en.txt``, ``de.txt``, ``sentence_groups.txt``), the first ``limit``."""
    d = Path(suite_dir)
    en_path, de_path = d / "en.txt", d / "de.txt"
    en, de = _read_lines(en_path), _read_lines(de_path)
    n = _same_length({en_path: en, de_path: de})
    examples = []
    for start, end in read_groups(d / "sentence_groups.txt", n):
        if limit is not None and len(examples) == limit:
            break
        src_ctx, source = _split_context(en[start], en_path, start + 1)
        for i in range(start + 1, end):
            if _split_context(en[i], en_path, i + 1) != (src_ctx, source):
                raise ValueError(f"{en_path}:{i + 1}: differs from line {start + 1}, the source of its group")
        tgt = [_split_context(de[i], de_path, i + 1) for i in range(start, end)]
        cands = [s for _, s in tgt]
        examples.append(Example(source, src_ctx, cands, [c for c, _ in tgt], "contrapro",
                                {"pronoun": contrapro_pronoun(cands[0], cands[1:])}, f"{de_path}:{start + 1}"))
    return examples


def _discevalmt_entries(set_name: str, data) -> List[Tuple[list, dict, Dict[str, str]]]:
    """(source [prev, current], {"good": [prev, cur], "bad": [prev, cur], "kind": ...}, categories)
    per pair, in the json's order: anaphora has four translations per source, lexical choice two
    examples per entry."""
    out = []
    for key, entry in data.items():
        if set_name == "anaphora":
            for trg in entry["trg"]:
                kind = "correct" if "correct" in trg else "semi-correct"
                out.append((entry["src"], {"good": trg[kind], "bad": trg["incorrect"]},
                            {"antecedent": trg["type"], "correctness": kind}))
        else:
            for ex in entry["examples"]:
                out.append((ex["src"], {"good": ex["trg"]["correct"], "bad": ex["trg"]["incorrect"]},
                            {"type": entry["type"]}))
    return out


def read_discevalmt(suite_dir, sets: Sequence[str] = tuple(DISCEVAL_SETS), limit: Optional[int] = None) -> List[Example]:
    """DiscEvalMT pairs of each set: the text files, checked against the json line by line."""
    d = Path(suite_dir)
    examples = []
    for set_name in sets:
        paths = {f"{part}.{lang}": d / f"{set_name}.{part}.{lang}" for part in ("prev", "current") for lang in ("en", "fr")}
        lines = {k: _read_lines(p) for k, p in paths.items()}
        n = _same_length({paths[k]: v for k, v in lines.items()})
        json_path = d / DISCEVAL_SETS[set_name]
        if not json_path.is_file():
            raise FileNotFoundError(f"{json_path}: suite file not found")
        try:
            entries = _discevalmt_entries(set_name, json.loads(json_path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{json_path}: not a DiscEvalMT {set_name} file ({type(e).__name__}: {e})") from None
        if 2 * len(entries) != n:
            raise ValueError(f"{paths['current.fr']} has {n} lines but {json_path} has {len(entries)} pairs (2 lines each)")
        for k, (src, trg, cats) in enumerate(entries[:limit]):
            for line, which in ((2 * k, "good"), (2 * k + 1, "bad")):
                expected = {"prev.en": src[0], "current.en": src[1], "prev.fr": trg[which][0], "current.fr": trg[which][1]}
                for part, text in expected.items():
                    if lines[part][line].strip() != text.strip():
                        raise ValueError(f"{paths[part]}:{line + 1}: does not match pair {k + 1} of {json_path} "
                                         f"({'correct' if which == 'good' else 'incorrect'} translation)")
            examples.append(Example(src[1], src[0], [trg["good"][1], trg["bad"][1]], [trg["good"][0], trg["bad"][0]],
                                    set_name, cats, f"{paths['current.fr']}:{2 * k + 1}"))
    return examples


def read_suite(suite: str, suite_dir, limit: Optional[int] = None) -> List[Example]:
    if suite not in SUITES:
        raise ValueError(f"--suite: expected one of {', '.join(SUITES)}, got {suite!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be positive, got {limit}")
    if not Path(suite_dir).is_dir():
        raise FileNotFoundError(f"{suite_dir}: suite directory not found (--suite-dir)")
    return read_contrapro(suite_dir, limit) if suite == "contrapro" else read_discevalmt(suite_dir, limit=limit)


# ---------------------------------------------------------------------------------------------- scoring

@dataclass(frozen=True)
class Request:
    """One force-decoding: ``src`` (ends in </s>), a forced and unscored target ``prefix``
    (target context + separator, or empty) and the scored ``tgt`` (ends in </s>)."""
    src: Tuple[int, ...]
    prefix: Tuple[int, ...]
    tgt: Tuple[int, ...]


class ForcedScorer:
    """Summed log-probabilities (natural log) of target sentences given source and context,
    from one loaded checkpoint (``extract.load_checkpoint``), in padded batches."""

    def __init__(self, loaded: "extract.LoadedModel", separator: Optional[str] = None, max_tokens: int = 4000,
                 batch_size: int = 64, progress: Optional[bool] = None):
        if max_tokens < 1 or batch_size < 1:
            raise ValueError(f"--max-tokens and --batch-size must be positive, got {max_tokens}, {batch_size}")
        self.loaded, self.max_tokens, self.batch_size, self.progress = loaded, max_tokens, batch_size, progress
        self.separator = separator or loaded.separator  # prepared.json's, else the task's, else the default
        self.sep_src, self.sep_tgt = loaded.src_dict.index(self.separator), loaded.tgt_dict.index(self.separator)
        self.max_src, self.max_tgt = (int(x) for x in loaded.model.max_positions())
        self.separators_replaced = 0  # separators SentencePiece made of look-alikes in the text (full-width ...)

    def check_separator(self) -> None:
        if self.sep_src == self.loaded.src_dict.unk() or self.sep_tgt == self.loaded.tgt_dict.unk():
            raise ValueError(f"{self.loaded.data_dir}: the dictionaries have no {self.separator!r} entry, so context "
                             f"cannot be given; use --context none")

    def _ids(self, text: str, side: str) -> List[int]:
        sp = self.loaded.spm_src if side == "src" else self.loaded.spm_tgt
        dictionary = self.loaded.src_dict if side == "src" else self.loaded.tgt_dict
        if sp is None:
            raise ValueError(f"{self.loaded.data_dir}: no SentencePiece model (prepared.json or --spm-model) to encode text with")
        pieces = [sp.encode(text, out_type=str)]
        # a separator inside one sentence would shift the context split: replaced by a space (counted)
        self.separators_replaced += sum(n for _, n in repair_separator_lookalikes(sp, [text], pieces, self.separator))
        return [dictionary.index(p) for p in pieces[0]]

    def request(self, src: Sequence[int], tgt: Sequence[int], src_context: Sequence[int] = (),
                tgt_context: Sequence[int] = (), where: str = "") -> Request:
        """Token ids (no </s>) -> a Request; a context (source or target) adds the separator. Too
        long for the model's positions is an error naming ``where``."""
        eos = self.loaded.tgt_dict.eos()
        s = (list(src_context) + [self.sep_src] if len(src_context) else []) + list(src) + [self.loaded.src_dict.eos()]
        prefix = list(tgt_context) + [self.sep_tgt] if len(tgt_context) else []
        t = list(tgt) + [eos]
        if len(s) > self.max_src or len(prefix) + len(t) > self.max_tgt:
            raise ValueError(f"{where}: {len(s)} source / {len(prefix) + len(t)} target tokens with context exceed the "
                             f"model's positions ({self.max_src} / {self.max_tgt})")
        return Request(tuple(s), tuple(prefix), tuple(t))

    def text_request(self, source: str, target: str, src_context: str = "", tgt_context: str = "",
                     where: str = "") -> Request:
        return self.request(self._ids(source, "src"), self._ids(target, "tgt"),
                            self._ids(src_context, "src") if src_context.strip() else (),
                            self._ids(tgt_context, "tgt") if tgt_context.strip() else (), where)

    def score(self, requests: Sequence[Request], desc: str = "score") -> Dict[Request, float]:
        """{request: summed log-probability of its ``tgt``}; each distinct request is scored once."""
        from reluformer_mt.console import Progress

        unique = list(OrderedDict.fromkeys(requests))
        pairs = [extract.Pair(torch.tensor(r.src), torch.tensor(r.prefix + r.tgt), [], []) for r in unique]
        groups = list(extract.batches(pairs, self.max_tokens, self.batch_size))
        # a bar on a terminal, else a line every 30 s; by default for 20 batches or more
        bar = Progress(len(groups), desc, "batches", enabled=self.progress if self.progress is not None
                       else len(groups) >= 20)
        out: Dict[Request, float] = {}
        for indices in groups:
            for i, lp in zip(indices, self._score_batch([unique[i] for i in indices])):
                out[unique[i]] = lp
            bar.update(1)
        bar.close()
        return out

    @torch.no_grad()
    def _score_batch(self, reqs: Sequence[Request]) -> List[float]:
        loaded = self.loaded
        pad, eos, device = loaded.tgt_dict.pad(), loaded.tgt_dict.eos(), loaded.device
        left_src = bool(getattr(loaded.cfg.task, "left_pad_source", True))  # as in training
        src = extract._pad([torch.tensor(r.src) for r in reqs], loaded.src_dict.pad(), left_src).to(device)
        full = [torch.tensor(r.prefix + r.tgt) for r in reqs]
        target = extract._pad(full, pad, False).to(device)
        prev = extract._pad([torch.cat([t.new_tensor([eos]), t[:-1]]) for t in full], pad, False).to(device)
        net = loaded.model(src, torch.tensor([len(r.src) for r in reqs], device=device), prev)
        lprobs = loaded.model.get_normalized_probs(net, log_probs=True)
        token_lp = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).double()  # (B, T)
        pos = torch.arange(target.shape[1], device=device)
        starts = torch.tensor([len(r.prefix) for r in reqs], device=device)[:, None]
        ends = starts + torch.tensor([len(r.tgt) for r in reqs], device=device)[:, None]
        scored = (pos >= starts) & (pos < ends)  # the candidate and its </s>; not the context, not padding
        return token_lp.masked_fill(~scored, 0.0).sum(1).tolist()


# ---------------------------------------------------------------------------------------------- decisions

def check_languages(suite: str, checkpoint, src_lang: Optional[str], tgt_lang: Optional[str],
                    any_languages: bool = False) -> Optional[str]:
    """The suite's language pair against the checkpoint's: a mismatch (a grc->en model on
    ContraPro) would only fail later on some length or vocabulary error, or score nonsense. Returns
    a note when ``any_languages`` lets it through (the pipeline check of a test-scale model), else
    None; an unknown checkpoint pair passes."""
    src, tgt = SUITE_LANGUAGES[suite]
    if not src_lang or not tgt_lang or (src_lang, tgt_lang) == (src, tgt):
        return None
    message = (f"--suite {suite} is {src}->{tgt}, but {checkpoint} translates {src_lang}->{tgt_lang}: "
               "the languages do not match")
    if not any_languages:
        raise ValueError(message + " (--any-languages scores it anyway)")
    return message + "; scored anyway (--any-languages): the accuracy says nothing about context use"


def check_options(context: str, score: str) -> None:
    if context not in CONTEXTS:
        raise ValueError(f"--context: expected previous or none, got {context!r}")
    if score not in SCORES:
        raise ValueError(f"--score: expected sum or mean, got {score!r}")


def candidate_score(logprob: float, n_tokens: int, score: str) -> float:
    """``sum``: log p(candidate); ``mean``: per scored token (candidate tokens + </s>)."""
    return logprob if score == "sum" else logprob / n_tokens


def is_correct(scores: Sequence[float]) -> bool:
    """The correct candidate (first) beats every contrastive one strictly; a tie is wrong."""
    return scores[0] > max(scores[1:])


def _accuracy(records: Sequence[dict], score: str) -> dict:
    other = "mean" if score == "sum" else "sum"
    n = len(records)
    right = sum(r["correct"][score] for r in records)
    return {"examples": n, "correct": right, "accuracy": 100.0 * right / n if n else float("nan"),
            "chance": 100.0 * sum(1.0 / r["candidates"] for r in records) / n if n else float("nan"),
            "ties": sum(r["tie"][score] for r in records),
            f"accuracy_{other}": 100.0 * sum(r["correct"][other] for r in records) / n if n else float("nan"),
            "flipped_by_other_score": sum(r["correct"][score] != r["correct"][other] for r in records)}


def summarise(records: Sequence[dict], score: str) -> Dict[str, dict]:
    """{set: accuracy dict + ``by``: {breakdown: {value: accuracy dict}}}, sets in first-seen order."""
    sets: Dict[str, dict] = OrderedDict()
    for set_name in OrderedDict.fromkeys(r["set"] for r in records):
        rows = [r for r in records if r["set"] == set_name]
        entry = _accuracy(rows, score)
        entry["by"] = {key: {v: _accuracy([r for r in rows if r["categories"][key] == v], score)
                             for v in sorted({r["categories"][key] for r in rows})}
                       for key in rows[0]["categories"]}
        sets[set_name] = entry
    return sets


def evaluate_examples(scorer: ForcedScorer, examples: Sequence[Example], context: str = "previous",
                      score: str = "sum") -> dict:
    """Score every candidate of ``examples``; returns ``sets`` (accuracies) and ``examples``
    (per example: where, categories, summed log-probs, token counts, decisions)."""
    check_options(context, score)
    if context == "previous":
        scorer.check_separator()
    requests = []
    for ex in examples:
        src_ctx = ex.src_context if context == "previous" else ""
        requests.append([scorer.text_request(ex.source, cand, src_ctx, tctx if context == "previous" else "", ex.where)
                         for cand, tctx in zip(ex.candidates, ex.tgt_contexts)])
    logprobs = scorer.score([r for rs in requests for r in rs], desc=f"contrastive ({context} context)")
    records = []
    for ex, reqs in zip(examples, requests):
        lps, lens = [logprobs[r] for r in reqs], [len(r.tgt) for r in reqs]
        by = {s: [candidate_score(lp, n, s) for lp, n in zip(lps, lens)] for s in SCORES}
        records.append({"where": ex.where, "set": ex.set, "categories": ex.categories, "candidates": len(reqs),
                        "logprob": lps, "tokens": lens, "correct": {s: is_correct(v) for s, v in by.items()},
                        "tie": {s: v[0] == max(v[1:]) for s, v in by.items()}})
    return {"sets": summarise(records, score), "examples": records}


def run_contrastive(checkpoint, suite: str, suite_dir, context: str = "previous", score: str = "sum", data=None,
                    spm_models=None, limit: Optional[int] = None, max_tokens: int = 4000, batch_size: int = 64,
                    device: str = "cpu", progress: Optional[bool] = None, any_languages: bool = False) -> dict:
    """Read the suite, load the checkpoint and score: the report of ``reluformer-eval contrastive``.
    A checkpoint of another language pair than the suite's is an error unless ``any_languages``."""
    check_options(context, score)
    examples = read_suite(suite, suite_dir, limit)  # bad options and suite files fail before the model loads
    loaded = extract.load_checkpoint(checkpoint, data, spm_models, device)
    language_note = check_languages(suite, checkpoint, loaded.src_lang, loaded.tgt_lang, any_languages)
    scorer = ForcedScorer(loaded, max_tokens=max_tokens, batch_size=batch_size, progress=progress)
    result = evaluate_examples(scorer, examples, context, score)
    full = limit is None
    return {"suite": suite, "suite_dir": str(suite_dir), "context": context, "score": score, "limit": limit,
            "model": loaded.describe(), "separator": scorer.separator,
            "separators_replaced": scorer.separators_replaced,
            "definition": (f"accuracy = share of examples whose correct candidate has a strictly higher {score} "
                           f"log-probability than every contrastive one (ties count as wrong); chance = mean of "
                           f"1/candidates; context {context}"),
            "no_context_check": (context == "none" and suite == "discevalmt" and full),
            "notes": [language_note] if language_note else [], **result}


def table_rows(report: dict) -> List[list]:
    """Rows of set / breakdown / value with examples, accuracy, chance, ties and the other score."""
    other = "mean" if report["score"] == "sum" else "sum"
    rows = []
    for set_name, entry in report["sets"].items():
        line = lambda label, e: [label, e["examples"], e["accuracy"], e["chance"], e["ties"],  # noqa: E731
                                 e[f"accuracy_{other}"], e["flipped_by_other_score"]]
        rows.append(line(set_name, entry))
        for key, values in entry["by"].items():
            rows += [line(f"  {key}={v}", e) for v, e in values.items()]
    return rows


def table_headers(report: dict) -> List[str]:
    other = "mean" if report["score"] == "sum" else "sum"
    return ["set / category", "examples", f"accuracy % ({report['score']})", "chance %", "ties",
            f"accuracy % ({other})", "flipped"]
