"""The low-resource recipe as a search space of the family tuner (``reluformer-study --tune ...
--space recipe``), and successive halving over the sentence phase (``--first-rung N``).

What the low-resource papers tune, for every family alike:

- Araabi & Monz (COLING 2020, "Optimizing Transformer for Low-Resource Neural Machine
  Translation"): depth, width, heads and feed-forward size, dropout, attention and activation
  dropout, label smoothing, decoder layer-drop and target word dropout gain up to +7.3 BLEU over
  default settings at 5k-10k sentence pairs;
- Sennrich & Zhang (ACL 2019, "Revisiting Low-Resource Neural Machine Translation"): small
  batches, word dropout, tuned learning rate and label smoothing.

Each knob reaches training as a field of the demo's options (model size, tokens per batch) or as a
fairseq-train option (``flag``); word dropout is this plugin's task option
(:class:`reluformer_mt.tasks.document_translation.DocumentTranslationConfig`), the rest is
fairseq's. The vocabulary size is not searched here: every family trains on the one prepared
corpus of the search (``--vocab-size`` of the demo), so the families stay comparable token for token.

Successive halving (Jamieson & Talwalkar 2016; asynchronous, Li et al. 2020, as Optuna's
``SuccessiveHalvingPruner``): a trial trains its sentence phase in rungs of ``first_rung``,
``first_rung * factor``, ... updates; after each rung fairseq's own validation at the rung's last
update is reported (its loss without label smoothing by default, or its greedy s-BLEU:
:func:`rung_value`), and a trial outside the best ``1/factor`` of those that reached the rung stops there. Rungs only fall inside the sentence phase, so every trial
compares with the others while they all train on verses, whatever their sentence/document split.
A rung's score is stored in the trial's ``rungs.json``, so a resumed trial reports it again
without training it again.
"""
import json
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

# the tuner's Knob (imported lazily by the tuner to keep one definition)


def recipe_knobs(Knob) -> tuple:
    """The recipe's knobs, shared by every family (``Knob``: the tuner's class)."""
    return (
        Knob("embed_dim", choices=(64, 128, 256)),
        Knob("layers", choices=(2, 3, 4, 5)),
        Knob("heads", choices=(2, 4)),
        Knob("ffn_ratio", choices=(2, 4)),
        Knob("max_tokens", choices=(1024, 2048, 4096)),
        Knob("attention_dropout", 0.0, 0.3, step=0.1, flag="--attention-dropout"),
        Knob("activation_dropout", 0.0, 0.3, step=0.1, flag="--activation-dropout"),
        Knob("label_smoothing", 0.1, 0.5, step=0.1, flag="--label-smoothing"),
        Knob("target_word_dropout", 0.0, 0.3, step=0.05, flag="--target-word-dropout"),
        Knob("source_word_dropout", 0.0, 0.2, step=0.05, flag="--source-word-dropout"),
        Knob("decoder_layerdrop", 0.0, 0.3, step=0.1, flag="--decoder-layerdrop"),
    )


# the quick preset's values of the recipe's knobs: the preset trial of a recipe search is the demo
RECIPE_PRESET = {"embed_dim": 64, "layers": 2, "heads": 4, "ffn_ratio": 2, "max_tokens": 4096,
                 "attention_dropout": 0.0, "activation_dropout": 0.0, "label_smoothing": 0.1,
                 "target_word_dropout": 0.0, "source_word_dropout": 0.0, "decoder_layerdrop": 0.0}
# the demo's options a recipe trial sets (the tuned presets carry them, experiments/demo.TUNED_FIELDS)
SIZE_FIELDS = ("embed_dim", "ffn_dim", "layers", "heads", "max_tokens")


def size_settings(params: dict) -> dict:
    """The demo's model-size and batch fields of a recipe trial's ``params`` ({} without them)."""
    if "embed_dim" not in params:
        return {}
    embed = int(params["embed_dim"])
    return {"embed_dim": embed, "ffn_dim": embed * int(params["ffn_ratio"]), "layers": int(params["layers"]),
            "heads": int(params["heads"]), "max_tokens": int(params["max_tokens"])}


def rungs(first: int, factor: int, limit: int) -> List[int]:
    """Rung ends in updates: first, first*factor, ... while below ``limit`` (the sentence phase's
    updates; its end is the trial's full run, not a rung)."""
    ends, end = [], first
    while 0 < end < limit:
        ends.append(end)
        end *= factor
    return ends


def pruner(first: int, factor: int):
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=factor, min_early_stopping_rate=0)


RUNG_METRICS = ("nll", "bleu")


def rung_score(log_file: Path, end: int) -> dict:
    """Fairseq's validation at update ``end`` (it validates when a run reaches --max-update): the
    label-smoothing-free loss ``nll_loss`` (bits per target token) and the greedy ``s_bleu``."""
    from reluformer_mt.experiments.curves import read_learning_curve

    points = [p for p in read_learning_curve(log_file)["valid"] if p["update"] <= end and p["nll_loss"] is not None]
    if not points:
        raise RuntimeError(f"{log_file}: no validation up to update {end}")
    return {"nll_loss": points[-1]["nll_loss"], "s_bleu": points[-1]["s_bleu"]}


def rung_value(score, metric: str, record: Path) -> float:
    """What a rung reports to the pruner (higher is better): -nll_loss or the greedy s-BLEU.

    ``nll`` is the default: at the first rungs most settings' greedy s-BLEU is still near zero (0.00
    to 0.04 at 500 updates in the first search), so it ranks them by noise, while the loss
    already separates them; label smoothing differs between trials, so the smoothing-free
    ``nll_loss`` is compared, not the training criterion's loss."""
    if not isinstance(score, dict):  # a rung of a search that stored s-BLEU alone
        if metric != "bleu":
            raise ValueError(f"{record}: its rungs hold greedy s-BLEU only; resume it with --rung-metric bleu")
        return score
    return -score["nll_loss"] if metric == "nll" else score["s_bleu"]


def train_rung(o, family: str, dirs: Dict[str, Path], end: int) -> dict:
    """Train the family's sentence phase to update ``end`` (resuming its checkpoint) and score it;
    the seconds spent are kept where the demo's training adds them to the phase's time."""
    import time

    from reluformer_mt.experiments.demo import family_run, phase_files, positions
    from reluformer_mt.experiments.run import train_args
    from reluformer_mt.fairseq_runner import run_fairseq

    run = family_run(o, family)
    phase, save_dir, log_file = phase_files(o, family, run)[0]
    run = replace(run, validate_every=end)  # one validation per rung, at its end: the score reported
    if phase.name != "sentence":
        raise ValueError("--first-rung: successive halving needs a sentence phase (--tune-updates with a sentence share)")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    spent = save_dir / "seconds_before_resume.txt"
    before = float(spent.read_text()) if spent.exists() else 0.0
    start = time.time()
    run_fairseq("train", train_args(run, replace(phase, updates=end), dirs["sentence"], save_dir, log_file, positions(dirs)))
    save_dir.mkdir(parents=True, exist_ok=True)
    spent.write_text(f"{before + time.time() - start:.1f}\n")
    return rung_score(log_file, end)


def climb_rungs(o, family: str, dirs: Dict[str, Path], trial, ends: List[int], trial_dir: Path,
                metric: str = "nll") -> dict:
    """Report each rung's ``metric`` to the Optuna ``trial``; {"pruned_at": end, "score": rung}
    where the pruner stops it, else {}. Rungs already in ``rungs.json`` are reported again, not
    retrained (each keeps both measures, so either metric can rank them)."""
    from reluformer_mt.data.textfiles import write_text_atomically

    record = trial_dir / "rungs.json"
    scores = {int(k): v for k, v in json.loads(record.read_text()).items()} if record.exists() else {}
    for end in ends:
        if end not in scores:
            scores[end] = train_rung(o, family, dirs, end)
            write_text_atomically(record, json.dumps(scores, indent=1) + "\n")
        trial.report(rung_value(scores[end], metric, record), end)
        if trial.should_prune():
            return {"pruned_at": end, "score": scores[end]}
    return {}
