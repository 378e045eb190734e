"""95 % confidence intervals and significance of differences between systems on one test set:
sacreBLEU's paired bootstrap resampling (Koehn 2004, "Statistical significance tests for machine
translation evaluation"; ``sacrebleu --paired-bs``), every system against one baseline system.

With one training seed, small differences (3.42 against 3.40 BLEU) are within the noise of the
test set alone; the intervals and p-values say which differences are not. They do not cover the
variance between training runs (seeds), which is often larger.
"""
from typing import Dict, Mapping, Sequence

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

ALPHA = 0.05
N_SAMPLES = 1000


def _metrics(names: Sequence[str]) -> Dict[str, object]:
    known = {"BLEU": lambda: BLEU(), "chrF": lambda: CHRF(), "chrF++": lambda: CHRF(word_order=2)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"paired bootstrap: unknown metric(s) {unknown}, expected some of {list(known)}")
    return {n: known[n]() for n in names}


def paired_bootstrap(systems: Mapping[str, Sequence[str]], references: Sequence[str], baseline: str,
                     metrics: Sequence[str] = ("BLEU", "chrF"), n_samples: int = N_SAMPLES) -> dict:
    """Scores with 95 % intervals of every system, and p-values of its difference to ``baseline``.

    ``systems``: name -> hypotheses (one a sentence, aligned with ``references``). Returns
    ``{"baseline", "n_samples", "alpha", "signatures": {metric: str}, "systems": {name: {metric:
    {"score", "mean", "ci", "p_value", "significant"}}}}``, where ``mean ± ci`` is the bootstrap's
    95 % interval, ``p_value`` (None for the baseline) the share of resamples in which the
    difference to the baseline is not larger than the observed one (sacreBLEU's paired bootstrap)
    and ``significant`` whether it is below 0.05. sacreBLEU's fixed seed (SACREBLEU_SEED, 12345)
    makes it repeatable.
    """
    if baseline not in systems:
        raise ValueError(f"paired bootstrap: baseline {baseline!r} is not among the systems {list(systems)}")
    for name, hyps in systems.items():
        if len(hyps) != len(references):
            raise ValueError(f"paired bootstrap: {name} has {len(hyps)} hypotheses for {len(references)} references")
    if len(references) < 2:
        raise ValueError(f"paired bootstrap needs at least 2 sentences, got {len(references)}")
    order = [baseline] + [n for n in systems if n != baseline]
    named = [(n, list(systems[n])) for n in order]
    if len(named) == 1:  # PairedTest compares; a lone baseline still gets its interval
        named.append(("__copy__", list(systems[baseline])))
    chosen = _metrics(metrics)
    signatures, scores = PairedTest(named, chosen, [list(references)], test_type="bs", n_samples=n_samples)()
    out: Dict[str, Dict[str, dict]] = {}
    for k, name in enumerate(scores["System"]):
        if name == "__copy__":
            continue
        out[name] = {}
        for metric, key in zip(metrics, [m for m in scores if m != "System"]):
            r = scores[key][k]
            p = None if r.p_value is None else float(r.p_value)
            if p is not None and r.score == scores[key][0].score:
                # sacreBLEU counts resampled differences strictly above the observed one: with no
                # difference at all (identical outputs, or both 0) that count is 0 and p = 1/(n+1)
                p = 1.0
            out[name][metric] = {"score": float(r.score), "mean": float(r.mean), "ci": float(r.ci), "p_value": p,
                                 "significant": None if p is None else p < ALPHA}
    return {"baseline": baseline, "n_samples": n_samples, "alpha": ALPHA,
            "signatures": {m: str(s) for m, s in zip(metrics, signatures.values())}, "systems": out}


def verdict(entry: dict, baseline_entry: dict) -> str:
    """'better' / 'worse' (significant at 0.05) or 'no significant difference'."""
    if entry.get("significant") is None:
        return "baseline"
    if not entry["significant"]:
        return "no significant difference"
    return "better" if entry["score"] > baseline_entry["score"] else "worse"


__all__ = ["paired_bootstrap", "verdict", "ALPHA", "N_SAMPLES"]

