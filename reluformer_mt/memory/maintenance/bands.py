"""Translation quality by fuzzy-match band: how much a translation memory helps where its
matches are good and where they are poor.

For each band of the best match's fuzzy score (<50, 50-70, 70-90, >=90, in %), s-BLEU over the
band's sentences of: the model with its memory, the same model without it (matches withheld),
and copying the retrieved target (the TM baseline a CAT tool offers), with the number of
sentences per band.
"""
from typing import Dict, List, Optional, Sequence

from reluformer_mt.evaluation.bleu import corpus_sbleu
from reluformer_mt.memory.tm import FUZZY_BANDS, at_least, band_of

BAND_HEADERS = ["band (fuzzy %)", "sentences", "with memory", "without memory", "copy of the match"]


def band_scores(references: Sequence[str], fuzzy: Sequence[float], systems: Dict[str, Sequence[str]]) -> List[dict]:
    """One dict per band (then '>=50', the bands above 50 together, and 'all'): ``band``, ``sentences`` and the s-BLEU of
    each system (None for an empty band)."""
    if any(len(h) != len(references) for h in systems.values()) or len(fuzzy) != len(references):
        raise ValueError(f"{len(references)} references, {len(fuzzy)} scores, system lengths "
                         f"{[len(h) for h in systems.values()]}")
    bands = [name for _, _, name in FUZZY_BANDS]
    members = {name: [i for i, s in enumerate(fuzzy) if band_of(float(s)) == name] for name in bands}
    members[">=50"] = [i for i, s in enumerate(fuzzy) if at_least(s, 0.5)]  # every band where the match is useful
    members["all"] = list(range(len(references)))
    rows = []
    for name in bands + [">=50", "all"]:
        idx = members[name]
        row = {"band": name, "sentences": len(idx)}
        for system, hyps in systems.items():
            row[system] = corpus_sbleu([hyps[i] for i in idx], [references[i] for i in idx]).score if idx else None
        rows.append(row)
    return rows


def band_table_rows(family: str, rows: List[dict], systems: Sequence[str]) -> List[list]:
    return [[f"{family}: {r['band']}", r["sentences"]] + [_num(r.get(s)) for s in systems] for r in rows]


def _num(value: Optional[float]):
    return float("nan") if value is None else value


__all__ = ["BAND_HEADERS", "band_scores", "band_table_rows"]
