"""Alignment error rate (Och & Ney, 2003, "A Systematic Comparison of Various Statistical
Alignment Models") with sure links S, possible links P (S ⊆ P) and predicted links A:

    precision = |A∩P| / |A|,  recall = |A∩S| / |S|,  AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|)

Counts are summed over all sentences before dividing (corpus level). Undefined ratios
(|A| = 0 for precision, |S| = 0 for recall, |A| + |S| = 0 for AER) are NaN, written as null
in JSON reports; on real gold sets the corpus sums are never zero.

Link files hold one sentence a line, links ``i-j`` (source index first) separated by spaces;
possible links use a mark instead of '-' (``3p4``). Gold files differ in index base (awesome-align's
gold sets are 1-based, Biçici's de-en.wa 0-based), so the base is an argument, never guessed.
Predicted links are 0-based by default (what ``reluformer-eval align`` writes).

Tokens of ``src ||| tgt`` and token files are split on ASCII spaces and tabs only: the Japanese
gold set (jaen) counts U+3000 (ideographic space) as a token, which ``str.split()`` would drop.
"""
import math
import re
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Set, Tuple

from reluformer_mt.data.textfiles import read_lines  # a BOM is dropped (Biçici's test.de has one)

Link = Tuple[int, int]  # (source index, target index), 0-based
_SPACE = re.compile(r"[ \t]+")


def tokens(line: str) -> List[str]:
    return [t for t in _SPACE.split(line.strip(" \t\r\n")) if t]


def parse_links(text: str, base: int = 0, possible_mark: Optional[str] = "p", where: str = ""
                ) -> Tuple[Set[Link], Set[Link]]:
    """Parse one line of links into (sure, possible-only) sets of 0-based (i, j).

    ``possible_mark=None`` rejects possible links (used for predictions). A link given both as sure
    and possible counts as sure.
    """
    if base not in (0, 1):
        raise ValueError(f"index base must be 0 or 1, got {base}")
    if possible_mark is not None and (not possible_mark or any(c.isdigit() or c.isspace() for c in possible_mark)):
        raise ValueError(f"possible-link mark must be non-empty without digits or spaces, got {possible_mark!r}")
    mark = rf"-|{re.escape(possible_mark)}" if possible_mark else "-"
    pattern = re.compile(rf"(\d+)({mark})(\d+)")
    sure, possible = set(), set()
    for tok in text.split():
        m = pattern.fullmatch(tok)
        if not m:
            expected = "'i-j'" + (f" or 'i{possible_mark}j'" if possible_mark else "")
            raise ValueError(f"{where}: malformed link {tok!r}, expected {expected} with integer indices")
        i, j = int(m.group(1)) - base, int(m.group(3)) - base
        if i < 0 or j < 0:
            raise ValueError(f"{where}: link {tok!r} has index 0 but the index base is 1 (is the file 0-based?)")
        (sure if m.group(2) == "-" else possible).add((i, j))
    return sure, possible - sure


def read_links(path, base: int = 0, possible_mark: Optional[str] = "p") -> List[Tuple[Set[Link], Set[Link]]]:
    """Read a link file: one (sure, possible-only) pair per line, 0-based."""
    return [parse_links(line, base, possible_mark, where=f"{path}:{n}") for n, line in enumerate(read_lines(path), 1)]


def read_gold(path, base: int = 1, possible_mark: str = "p") -> List[Tuple[Set[Link], Set[Link]]]:
    """Gold links as (S, P) per sentence, 0-based, with P ⊇ S."""
    return [(s, s | p) for s, p in read_links(path, base, possible_mark)]


def read_gold_naacl(path, n_sentences: int, sentence_base: int = 1, word_base: int = 0
                    ) -> List[Tuple[Set[Link], Set[Link]]]:
    """Gold links in the NAACL 2003 shared-task format: ``sent src tgt [S|P] [confidence]`` a line.

    Sentences without a line have no links, so the number of sentences is given. Biçici's
    ``de-en.ref.wa`` uses 1-based sentence ids and 0-based word ids (the defaults here).
    """
    gold = [(set(), set()) for _ in range(n_sentences)]
    for n, line in enumerate(read_lines(path), 1):
        f = line.split()
        if not f:
            continue
        if len(f) < 3 or not all(x.isdigit() for x in f[:3]) or (len(f) > 3 and f[3] not in ("S", "P")):
            raise ValueError(f"{path}:{n}: malformed line {line!r}, expected 'sentence source target [S|P]'")
        k, i, j = int(f[0]) - sentence_base, int(f[1]) - word_base, int(f[2]) - word_base
        if not 0 <= k < n_sentences:
            raise ValueError(f"{path}:{n}: sentence id {f[0]} out of range 1..{n_sentences}" if sentence_base else
                             f"{path}:{n}: sentence id {f[0]} out of range 0..{n_sentences - 1}")
        if i < 0 or j < 0:
            raise ValueError(f"{path}:{n}: negative word index in {line!r} (word base {word_base})")
        sure = len(f) == 3 or f[3] == "S"
        if sure:
            gold[k][0].add((i, j))
        gold[k][1].add((i, j))
    return gold


def read_predictions(path, base: int = 0) -> List[Set[Link]]:
    """Predicted links (no possible marks allowed)."""
    return [s for s, _ in read_links(path, base, possible_mark=None)]


def read_lengths(path, tgt_path=None) -> List[Tuple[int, int]]:
    """Sentence lengths (source, target) from a ``src ||| tgt`` file, or from two token files."""
    if tgt_path is None:
        out = []
        for n, line in enumerate(read_lines(path), 1):
            if line.count("|||") != 1:
                raise ValueError(f"{path}:{n}: expected 'source ||| target', found {line.count('|||')} '|||'")
            src, tgt = line.split("|||")
            out.append((len(tokens(src)), len(tokens(tgt))))
        return out
    src, tgt = read_lines(path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"{path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
    return [(len(tokens(s)), len(tokens(t))) for s, t in zip(src, tgt)]


def check_ranges(links: Sequence[Set[Link]], lengths: Sequence[Tuple[int, int]], path, base: int = 0) -> None:
    """Every link must lie inside its sentence; the error names file, line and link (in file indices)."""
    if len(links) != len(lengths):
        raise ValueError(f"{path} has {len(links)} lines but the sentence lengths cover {len(lengths)}")
    for n, (ls, (ns, nt)) in enumerate(zip(links, lengths), 1):
        for i, j in sorted(ls):
            if i >= ns or j >= nt:
                raise ValueError(f"{path}:{n}: link {i + base}-{j + base} out of range: the sentence has {ns} source "
                                 f"and {nt} target tokens (indices {base}..{ns - 1 + base} and {base}..{nt - 1 + base})")


def other_base_hint(links: Sequence[Set[Link]], base: int, lengths: Optional[Sequence[Tuple[int, int]]] = None
                    ) -> Optional[str]:
    """Why links read with ``base`` look like the other base, or None.

    Base 1 with an index 0 is already an error (:func:`parse_links`). Base 0 looks wrong when a
    tenth or more of the linked sentences have a link at index = sentence length (a 1-based file
    aligns the last words), or, without lengths, when no link at all uses index 0.
    """
    if base != 0:
        return None
    linked = [ls for ls in links if ls]
    if not linked:
        return None
    if lengths is not None:
        at_end = sum(1 for ls, (ns, nt) in zip(links, lengths) if any(i == ns or j == nt for i, j in ls))
        if at_end and at_end * 10 >= len(linked):
            return (f"{at_end} of {len(linked)} linked sentences have a link at index = sentence length, one past the "
                    "last 0-based index: the file looks 1-based")
    if not any(i == 0 or j == 0 for ls in linked for i, j in ls):
        return f"no link of {len(linked)} linked sentences uses index 0: the file looks 1-based"
    return None


def diagonal_alignment(n_src: int, n_tgt: int) -> Set[Link]:
    """Baseline: target word j links to the source word at the same relative position."""
    if n_src == 0:
        return set()
    return {(min(n_src - 1, int((j + 0.5) * n_src / n_tgt)), j) for j in range(n_tgt)}


def format_links(links: Set[Link], base: int = 0) -> str:
    return " ".join(f"{i + base}-{j + base}" for i, j in sorted(links))


@dataclass
class AERResult:
    precision: float
    recall: float
    aer: float
    n_sentences: int
    n_predicted: int  # |A|
    n_sure: int  # |S|
    n_possible: int  # |P| (includes the sure links)
    a_and_s: int
    a_and_p: int

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(num: int, den: int) -> float:
    return num / den if den else math.nan


def corpus_aer(predicted: Sequence[Set[Link]], gold: Sequence[Tuple[Set[Link], Set[Link]]]) -> AERResult:
    """Corpus-level precision, recall and AER: counts summed over sentences, then divided.

    ``gold`` holds (S, P) per sentence; P is completed with S here, so S ⊆ P holds even for
    hand-built input.
    """
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted sentences but {len(gold)} gold sentences")
    n_a = n_s = n_p = a_s = a_p = 0
    for a, (s, p) in zip(predicted, gold):
        p = p | s
        n_a, n_s, n_p = n_a + len(a), n_s + len(s), n_p + len(p)
        a_s, a_p = a_s + len(a & s), a_p + len(a & p)
    aer = 1.0 - (a_s + a_p) / (n_a + n_s) if n_a + n_s else math.nan
    return AERResult(precision=_ratio(a_p, n_a), recall=_ratio(a_s, n_s), aer=aer, n_sentences=len(gold),
                     n_predicted=n_a, n_sure=n_s, n_possible=n_p, a_and_s=a_s, a_and_p=a_p)
