"""Equal tuning for every attention family: each family gets the same search budget on the
validation chapters before any comparison is reported (``reluformer-study --tune``).

Why: architecture comparisons flip when only one side is tuned (Melis, Dyer & Blunsom, "On the
State of the Art of Evaluation in Neural Language Models", ICLR 2018; Narang et al., "Do
Transformer Modifications Transfer Across Implementations and Applications?", EMNLP 2021). The
demo's quick preset was chosen on softmax alone (docs/QUALITY_STUDY.md); this search gives
ReLUFormer, ReLA and softmax the same number of trials over the shared settings (learning rate,
warm-up, dropout, the split of the updates between the sentence and the document phase) and over
each family's own knobs (:data:`FAMILY_KNOBS`; softmax has none, so it gets the same number of
trials over the shared settings alone).

A trial trains the demo's model exactly as ``make demo`` does (sentences, then 128-token document
segments, the same total updates) with the trial's settings, and scores it like the demo scores a
model, but on the validation chapters: s-BLEU of the document translator (beam search, constrained
separators). The test chapters are never read.

Choices where the methods leave one open (each an option):

- The budget is counted in updates, not minutes: every trial of every family trains the same
  number of updates (the demo compares families at equal updates too), so the search is
  reproducible on any machine; the CPU minutes each family spent are printed beside it.
- Two search spaces: ``shared`` (the settings above) and ``recipe`` (those and the low-resource
  recipe's: model size, tokens per batch, attention and activation dropout, label smoothing, word
  dropout, decoder layer-drop; :mod:`.recipe`).
- Pruning is off by default (every trial runs its full budget); ``first_rung`` turns on successive
  halving over the sentence phase (:mod:`.recipe`): rungs end inside every trial's sentence phase,
  so trials with different sentence/document splits still compare at the same step, on verses.
- The sampler is Optuna's TPE (Bergstra et al. 2011), seeded per family and per trial number: a
  search interrupted and resumed proposes the same trials as one that ran through.
- One training seed per trial; the length study runs the chosen settings over several seeds.

Resumable: the trials live in an Optuna journal (``OUT/FAMILY/journal.log``); rerunning the same
command keeps the finished trials and resumes a killed one from its last checkpoint (its folder is
named by its settings, so the resumed trial finds its checkpoints).
"""
import hashlib
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from reluformer_mt.experiments.recipe import RECIPE_PRESET, recipe_knobs, size_settings

TUNED_PRESETS = Path(__file__).with_name("tuned_presets.json")  # the chosen settings the quick demo reads
# the recipe search's choice (--space recipe), which the reference run reads (reluformer-demo
# --preset reference): a file of its own, so that it does not change the quick demo's budget
RECIPE_PRESETS = Path(__file__).with_name("tuned_presets_recipe.json")
DEMO_CONFIGS = Path(__file__).parents[2] / "configs" / "demo"  # the hydra presets of a checkout (tuned/FAMILY.yaml)
SHARED_FAMILIES = ("reluformer", "rela", "softmax")


@dataclass(frozen=True)
class Knob:
    """One tuned setting: a float range (``log``: sampled on a log scale; ``step``: a grid) or
    ``choices``. ``flag`` says how it reaches fairseq-train: None for a setting of the demo's
    options (lr, dropout, ...), else the fairseq-train option it is given as."""

    name: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: Optional[float] = None
    choices: Sequence = ()
    flag: Optional[str] = None

    def suggest(self, trial):
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)

    def describe(self) -> str:
        if self.choices:
            return "{" + ", ".join(str(c) for c in self.choices) + "}"
        return f"[{self.low:g}, {self.high:g}]" + (" log" if self.log else "") + (f" step {self.step:g}" if self.step else "")


SPACES = ("shared", "recipe")
RECIPE_KNOBS = recipe_knobs(Knob)  # the low-resource recipe's knobs (experiments/recipe.py)

# Shared by every family; the ranges bracket the quick preset's values (lr 5e-3, warm-up 200,
# dropout 0.1, 60 % of the updates on sentences)
SHARED_KNOBS = (
    Knob("lr", 1e-3, 1.2e-2, log=True),
    Knob("warmup_updates", choices=(100, 200, 400)),
    Knob("dropout", 0.0, 0.3, step=0.05),
    Knob("sentence_share", 0.3, 0.8, step=0.1),
)
# Each family's own knobs (docs/METHODS.md): ReLUFormer's temperature gamma (fixed, or learned per
# layer / head from that start), its 1/sqrt(n_i/2) length factor (on / off), and the weights of
# its criterion's two attention regularisers; ReLA's gate (ReLA-g / ReLA-i) and RMSNorm gain start
FAMILY_KNOBS: Dict[str, tuple] = {
    "reluformer": (
        Knob("relu_gamma", 0.25, 4.0, log=True, flag="--relu-gamma"),
        Knob("relu_gamma_mode", choices=("fixed", "layer", "head"), flag="--relu-gamma-mode"),
        Knob("relu_length_scale", choices=(True, False), flag="--relu-no-length-scale"),
        Knob("norm_loss_weight", 0.01, 1.0, log=True, flag="--norm-loss-weight"),
        Knob("entropy_margin_weight", 0.0, 0.3, step=0.05, flag="--entropy-margin-weight"),
    ),
    "rela": (
        Knob("rela_variant", choices=("gated", "ungated"), flag="--rela-variant"),
        Knob("rela_gain_init", 0.25, 4.0, log=True, flag="--rela-gain-init"),
    ),
    "softmax": (),
}


# the quick preset's values (experiments/demo.py PRESETS, the criterion's and the attention options'
# defaults): every family's search tries them once
PRESET_PARAMS = {"lr": 5e-3, "warmup_updates": 200, "dropout": 0.1, "sentence_share": 0.6, "relu_gamma": 1.0,
                 "relu_gamma_mode": "fixed", "relu_length_scale": True, "norm_loss_weight": 0.1,
                 "entropy_margin_weight": 0.1, "rela_variant": "gated", "rela_gain_init": 1.0, **RECIPE_PRESET}


def knobs_of(family: str, space: str = "shared") -> tuple:
    if family not in FAMILY_KNOBS:
        raise ValueError(f"--tune: unknown family {family!r}; expected some of {', '.join(FAMILY_KNOBS)}")
    if space not in SPACES:
        raise ValueError(f"--space: got {space!r}, expected one of {', '.join(SPACES)}")
    return SHARED_KNOBS + (RECIPE_KNOBS if space == "recipe" else ()) + FAMILY_KNOBS[family]


def fairseq_flags(family: str, params: dict) -> List[str]:
    """The knobs of ``params`` that are fairseq-train options (the family's own, and the recipe's
    when ``params`` holds them), as arguments."""
    argv = []
    recipe = tuple(k for k in RECIPE_KNOBS if k.flag) if "embed_dim" in params else ()
    for knob in recipe + FAMILY_KNOBS[family]:
        value = params[knob.name]
        if knob.name == "relu_length_scale":  # a negated flag: given only to turn the factor off
            argv += [] if value else [knob.flag]
        else:
            argv += [knob.flag, str(value)]
    return argv


def presets_file(space: str) -> Path:
    """Where ``--write-presets`` puts a search's choice: by the space it searched."""
    return RECIPE_PRESETS if space == "recipe" else TUNED_PRESETS


def split_updates(total: int, share: float) -> tuple:
    """(sentence, document) updates of a ``total`` budget, sentences ``share`` of it, in 50s."""
    sentence = int(round(total * share / 50.0)) * 50
    return sentence, total - sentence


def trial_options(base, family: str, params: dict, total_updates: int, out: Path):
    """The demo's options (:class:`reluformer_mt.experiments.demo.DemoOptions`) of one trial."""
    sentence, document = split_updates(total_updates, params["sentence_share"])
    return replace(base, out=out, families=[family], lr=params["lr"], warmup_updates=int(params["warmup_updates"]),
                   dropout=params["dropout"], sentence_updates=sentence, max_update=document, **size_settings(params),
                   train_args=list(base.train_args) + fairseq_flags(family, params), knn=False, pieces_weight=0.0)


def settings_key(params: dict) -> str:
    """A short name of a trial's settings: the folder a resumed trial finds its checkpoints in."""
    text = json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


# ------------------------------------------------------------------------------------ one trial
@dataclass(frozen=True)
class Halving:
    """Where a worker finds its Optuna trial to report rungs to (successive halving is on)."""

    journal: Path
    study: str
    trial_id: int
    first_rung: int
    factor: int
    metric: str = "nll"  # what a rung reports (recipe.rung_value)

    def open_trial(self):
        import optuna

        from reluformer_mt.experiments.recipe import pruner

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=self.study, storage=_storage(self.journal),
                                  pruner=pruner(self.first_rung, self.factor))
        ranked_by = study.user_attrs.get("rung_metric")
        if ranked_by is None:
            study.set_user_attr("rung_metric", self.metric)
        elif ranked_by != self.metric:  # rungs of two measures cannot rank each other
            raise ValueError(f"{self.journal}: its rungs are ranked by {ranked_by}; resume it with --rung-metric {ranked_by}")
        return optuna.trial.Trial(study, self.trial_id)


def run_trial(base, family: str, params: dict, total_updates: int, trial_dir: Path, dirs: Dict[str, Path],
              halving: Optional[Halving] = None) -> dict:
    """Train one trial as the demo trains a family, then translate the validation chapters;
    ``result.json`` in ``trial_dir`` (a finished trial is read back, not rerun). With ``halving``
    the sentence phase climbs its rungs first and may stop at one (``pruned_at``)."""
    from reluformer_mt.experiments.demo import bleu_of_model, process_cpu_seconds, train_family
    from reluformer_mt.experiments.recipe import climb_rungs, rungs

    done = trial_dir / "result.json"
    if done.exists():
        return json.loads(done.read_text(encoding="utf-8"))
    o = trial_options(base, family, params, total_updates, trial_dir)
    cpu_start, start = process_cpu_seconds(), time.time()
    if halving is not None:
        ends = rungs(halving.first_rung, halving.factor, o.sentence_updates)
        stopped = climb_rungs(o, family, dirs, halving.open_trial(), ends, trial_dir, halving.metric)
        if stopped:
            rung = stopped["score"] if isinstance(stopped["score"], dict) else {"s_bleu": stopped["score"]}
            result = {"family": family, "params": params, "valid_s_bleu": None, "rung_valid_s_bleu": rung["s_bleu"],
                      "rung_valid_nll_loss": rung.get("nll_loss"),
                      "pruned_at": stopped["pruned_at"], "cpu_seconds": round(process_cpu_seconds() - cpu_start, 1),
                      "wall_seconds": round(time.time() - start, 1)}
            _write_atomic(done, json.dumps(result, indent=1) + "\n")
            return result
    trained = train_family(o, family, dirs)
    valid = bleu_of_model(o, trained["checkpoint"], dirs["doc"], split="valid")
    result = {"family": family, "params": params, "valid_s_bleu": valid["s_bleu"], "valid_d_bleu": valid["d_bleu"],
              "valid_fallbacks": valid["fallbacks"], "segments": valid["segments"],
              "sentence_updates": o.sentence_updates, "document_updates": o.max_update,
              "train_cpu_seconds": trained.get("train_cpu_seconds"),
              "cpu_seconds": round(process_cpu_seconds() - cpu_start, 1), "wall_seconds": round(time.time() - start, 1),
              "checkpoint": str(trained["checkpoint"])}
    _write_atomic(done, json.dumps(result, indent=1) + "\n")
    return result


def _write_atomic(path: Path, text: str) -> None:
    from reluformer_mt.data.textfiles import write_text_atomically

    write_text_atomically(path, text)


# ------------------------------------------------------------------------------------ the search
@dataclass
class TuneOptions:
    out: Path
    families: Sequence[str] = SHARED_FAMILIES
    trials: int = 8  # per family: the same budget for every family
    total_updates: int = 2500  # per trial: the quick preset's 1,500 sentence + 1,000 document updates
    jobs: int = 2  # trials at once, one thread each
    startup_trials: int = 4  # random proposals before TPE models the finished ones
    sampler_seed: int = 1
    bible_root: Optional[str] = None
    device: str = "cpu"
    valid_chapters: int = 0  # validation chapters a trial translates (0: all)
    space: str = "shared"  # SPACES: the shared settings, or those and the low-resource recipe's
    first_rung: int = 0  # successive halving's first rung in sentence updates (0: no pruning)
    rung_factor: int = 3  # successive halving's reduction factor
    rung_metric: str = "nll"  # what a rung ranks by: recipe.RUNG_METRICS
    extra_target: Optional[str] = None  # the recipe's data (DemoOptions): a second translation ...
    train_lengths: Sequence[str] = ()  # ... and the document phase's training lengths
    retry_trials: Sequence[Tuple[str, int]] = ()  # (family, trial number): failures to run again


def _storage(path: Path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def _sampler(t: TuneOptions, family: str, number: int):
    """A sampler seeded by the family and the trial number: a resumed search proposes what an
    uninterrupted one would, given the same finished trials."""
    import optuna

    family_index = SHARED_FAMILIES.index(family) if family in SHARED_FAMILIES else len(SHARED_FAMILIES)
    seed = t.sampler_seed * 1_000_003 + family_index * 10_007 + number
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=t.startup_trials, multivariate=True)


class FamilySearch:
    """One family's Optuna study in its journal; counts, asks and tells its trials."""

    def __init__(self, t: TuneOptions, family: str, resume: bool = True):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.t, self.family, self.dir = t, family, t.out / family
        self.dir.mkdir(parents=True, exist_ok=True)
        self.storage = _storage(self.dir / "journal.log")
        self.study = optuna.create_study(study_name=family, storage=self.storage, direction="maximize",
                                         load_if_exists=True)
        self.journal = self.dir / "journal.log"
        if resume:  # not while reading the journals of a search that may still be running
            self._retry([n for f, n in t.retry_trials if f == family])
            self._requeue_interrupted()
            self._queue_the_preset()

    def _requeue_interrupted(self) -> None:
        """Trials left RUNNING by a killed search: marked failed and their settings queued again
        (the new trial resumes the same folder's checkpoints)."""
        from optuna.trial import TrialState

        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.enqueue_trial(trial.params, user_attrs={"resumes_trial": trial.number})
            self.storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            self.study.tell(trial.number, state=TrialState.FAIL)

    def _retry(self, numbers: Sequence[int]) -> None:
        """Failed trials named by ``--retry-trials`` (failed for a cause outside their settings, such
        as a stale folder): the folder moved aside, the settings queued again, and the failure no
        longer counted; the study's user attribute ``retried`` remembers them, so a resume with the
        same option does not queue them twice."""
        from optuna.trial import TrialState

        retried = list(self.study.user_attrs.get("retried", []))
        trials = {tr.number: tr for tr in self.study.get_trials(deepcopy=False)}
        for number in numbers:
            trial = trials.get(number)
            if number in retried:
                continue
            if trial is None or trial.state != TrialState.FAIL:
                state = "no such trial" if trial is None else trial.state.name
                raise ValueError(f"--retry-trials {self.family}:{number}: expected a failed trial in {self.journal}, "
                                 f"found {state}")
            folder = self.trial_dir(trial.params)
            if folder.exists():  # a fresh start: what it left (a stale checkpoint) stays beside, renamed
                folder.rename(folder.with_name(f"{folder.name}.failed-{number}"))
            self.study.enqueue_trial(trial.params, user_attrs={"retries_trial": number})
            retried.append(number)
            self.study.set_user_attr("retried", retried)

    def _queue_the_preset(self) -> None:
        """The quick preset's own settings (:data:`PRESET_PARAMS`) are one of every family's trials,
        so the search ends at least where the shared preset stands (queued once, at the next ask)."""
        preset = {knob.name: PRESET_PARAMS[knob.name] for knob in knobs_of(self.family, self.t.space)}
        if not any(tr.params == preset or tr.system_attrs.get("fixed_params") == preset
                   for tr in self.study.get_trials(deepcopy=False)):
            self.study.enqueue_trial(preset, user_attrs={"preset": "quick"})

    def counted(self) -> List:
        """Trials that used budget: finished, or failed for a reason of their own (not a kill, and
        not run again by ``--retry-trials``)."""
        from optuna.trial import TrialState

        retried = set(self.study.user_attrs.get("retried", []))
        return [tr for tr in self.study.get_trials(deepcopy=False)
                if tr.state in (TrialState.COMPLETE, TrialState.PRUNED)
                or (tr.state == TrialState.FAIL and not tr.user_attrs.get("interrupted") and tr.number not in retried)]

    def remaining(self) -> int:
        return max(0, self.t.trials - len(self.counted()))

    def ask(self):
        self.study.sampler = _sampler(self.t, self.family, len(self.study.trials))
        trial = self.study.ask()
        params = {knob.name: knob.suggest(trial) for knob in knobs_of(self.family, self.t.space)}
        return trial, params

    def halving(self, trial) -> Optional[Halving]:
        if not self.t.first_rung:
            return None
        return Halving(self.journal, self.family, trial._trial_id, self.t.first_rung, self.t.rung_factor,
                       self.t.rung_metric)

    def trial_dir(self, params: dict) -> Path:
        return self.dir / f"trial-{settings_key(params)}"


def prepare_data(t: TuneOptions, base) -> Dict[str, Path]:
    """The demo's corpus (sentence and 128-token segments, one SentencePiece model) in ``OUT/data``."""
    from reluformer_mt.experiments.demo import prepare_corpus

    return prepare_corpus(replace(base, out=t.out, families=list(t.families)))


def run_search(t: TuneOptions, base=None, report: Callable[[str], None] = None) -> dict:
    """Every family's trials, round robin (so the families advance at the same pace), ``t.jobs`` at
    a time; returns and writes the summary (``OUT/tuning.json``)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    from reluformer_mt.experiments.demo import DemoOptions
    from reluformer_mt.experiments.workers import run_in_worker, spawn_pool

    report = report or (lambda line: print(line, file=sys.stderr, flush=True))
    base = base or DemoOptions(out=t.out, families=list(t.families), bible_root=t.bible_root, device=t.device,
                               eval_chapters=t.valid_chapters, extra_target=t.extra_target,
                               train_lengths=list(t.train_lengths))
    for family in t.families:
        knobs_of(family, t.space)  # unknown names fail before any work
    searches = {family: FamilySearch(t, family) for family in t.families}  # a bad --retry-trials fails here
    dirs = prepare_data(t, base)
    report(f"tune: {', '.join(t.families)}: {t.trials} trials each of {t.total_updates} updates, {t.jobs} at a time; "
           + "; ".join(f"{f} {t.trials - s.remaining()} done" for f, s in searches.items()))
    started, running = time.time(), {}
    with spawn_pool(t.jobs) as pool:
        while True:
            while len(running) < t.jobs and _next_family(searches, running):
                family = _next_family(searches, running)
                trial, params = searches[family].ask()
                trial_dir = searches[family].trial_dir(params)
                future = pool.submit(run_in_worker, trial_dir / "trial.log", run_trial, base, family, params,
                                     t.total_updates, trial_dir, dirs, searches[family].halving(trial))
                running[future] = (family, trial, params)
                report(f"tune: {family} trial {trial.number} started: {describe_params(params)}")
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in finished:
                family, trial, params = running.pop(future)
                _tell(searches[family], trial, future, report, started)
    summary = write_summary(t, searches)
    report(f"tune: done in {(time.time() - started) / 60:.1f} min; {t.out / 'tuning.md'}")
    return summary


def _next_family(searches: Dict[str, FamilySearch], running: dict) -> Optional[str]:
    """The family with the fewest trials counted or running that still has budget."""
    in_flight = {f: sum(1 for fam, _, _ in running.values() if fam == f) for f in searches}
    open_ = [(len(s.counted()) + in_flight[f], f) for f, s in searches.items() if s.remaining() > in_flight[f]]
    return min(open_)[1] if open_ else None


def _tell(search: FamilySearch, trial, future, report, started: float) -> None:
    from optuna.trial import TrialState

    try:
        result = future.result()
    except Exception as error:  # a trial that failed by itself uses its budget; the search goes on
        search.study.tell(trial, state=TrialState.FAIL)
        report(f"tune: {search.family} trial {trial.number} FAILED: {str(error).splitlines()[0] if str(error) else error!r}")
        return
    if result.get("pruned_at"):
        for key in ("pruned_at", "rung_valid_s_bleu", "rung_valid_nll_loss", "cpu_seconds"):
            trial.set_user_attr(key, result.get(key))
        search.study.tell(trial, state=TrialState.PRUNED)
        report(f"tune: {search.family} trial {trial.number} ({len(search.counted())}/{search.t.trials}): stopped at "
               f"{result['pruned_at']} updates ({rung_text(result)})")
        return
    for key in ("valid_d_bleu", "valid_fallbacks", "cpu_seconds", "sentence_updates", "document_updates"):
        trial.set_user_attr(key, result[key])
    search.study.tell(trial, result["valid_s_bleu"])
    cpu = sum(tr.user_attrs.get("cpu_seconds", 0) for tr in search.counted())
    report(f"tune: {search.family} trial {trial.number} ({len(search.counted())}/{search.t.trials}): valid s-BLEU "
           f"{result['valid_s_bleu']:.2f} in {result['cpu_seconds'] / 60:.1f} CPU min; {search.family} so far "
           f"{cpu / 60:.1f} CPU min; best {search.study.best_value:.2f}; {(time.time() - started) / 60:.1f} min elapsed")


def describe_params(params: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


# ------------------------------------------------------------------------------------ the summary
def report_from_journals(t: TuneOptions) -> dict:
    """The summary of what the journals hold, training nothing (``--report-only``)."""
    return write_summary(t, {family: FamilySearch(t, family, resume=False) for family in t.families})


def family_summary(t: TuneOptions, search: FamilySearch) -> dict:
    from optuna.trial import TrialState

    trials = [{"number": tr.number, "state": tr.state.name, "valid_s_bleu": tr.value, "params": tr.params,
               **{k: v for k, v in tr.user_attrs.items() if k != "interrupted"}}
              for tr in sorted(search.counted(), key=lambda tr: tr.number)]
    complete = [tr for tr in trials if tr["state"] == TrialState.COMPLETE.name]
    best = max(complete, key=lambda tr: tr["valid_s_bleu"]) if complete else None
    return {"trials": trials, "budget": {"trials": t.trials, "updates_per_trial": t.total_updates,
                                         "cpu_minutes": round(sum(tr.get("cpu_seconds", 0) for tr in trials) / 60, 1)},
            "search_space": {k.name: k.describe() for k in knobs_of(search.family, t.space)},
            "finished": len(trials) >= t.trials, "best": best}


def rung_text(result: dict) -> str:
    """A stopped trial's last rung: its validation loss without smoothing and greedy s-BLEU."""
    nll, bleu = result.get("rung_valid_nll_loss"), result.get("rung_valid_s_bleu")
    return ", ".join(([] if nll is None else [f"valid nll {nll:.2f}"]) +
                     ([] if bleu is None else [f"greedy valid s-BLEU {bleu:.2f}"]))


def write_summary(t: TuneOptions, searches: Dict[str, FamilySearch]) -> dict:
    command = "reluformer-study --tune " + ",".join(t.families) + f" --trials {t.trials} --tune-updates {t.total_updates}"
    command += (f" --extra-target {t.extra_target}" if t.extra_target else "") + (
        f" --train-lengths {','.join(t.train_lengths)}" if t.train_lengths else "")
    command += (f" --space {t.space}" if t.space != "shared" else "") + (
        f" --first-rung {t.first_rung} --rung-factor {t.rung_factor} --rung-metric {t.rung_metric}" if t.first_rung else "")
    summary = {"command": command, "objective": "s-BLEU of the validation chapters (document translator, beam search)",
               "baseline": validation_baseline(t), "families": {f: family_summary(t, s) for f, s in searches.items()}}
    _write_atomic(t.out / "tuning.json", json.dumps(summary, indent=1) + "\n")
    _write_atomic(t.out / "tuning.md", render(summary))
    return summary


def validation_baseline(t: TuneOptions) -> Optional[dict]:
    """What no learning gets on the same validation chapters: copying the nearest training verse."""
    from reluformer_mt.evaluation.baselines import nearest_verse_translations
    from reluformer_mt.evaluation.bleu import corpus_sbleu

    data = next(iter(sorted((t.out / "data").glob("doc128.v*"))), None) if (t.out / "data").is_dir() else None
    if data is None:
        return None
    read = lambda name: (data / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    copies = nearest_verse_translations(read("train.words.grc"), read("train.words.en"), read("valid.words.grc"))
    return {"nearest_verse_valid_s_bleu": corpus_sbleu(copies, read("valid.words.en")).score}


def render(summary: dict) -> str:
    """The tuning table: budget, search space and best settings per family, then every trial."""
    base = (summary.get("baseline") or {}).get("nearest_verse_valid_s_bleu")
    lines = [f"Command: `{summary['command']}`; objective: {summary['objective']}."
             + ("" if base is None else f" Copying the nearest training verse scores {base:.2f} on the same chapters; "
                "an output of no words, 0."), "",
             "| family | trials | updates each | CPU minutes | best valid s-BLEU | best settings |", "|---|---|---|---|---|---|"]
    for family, f in summary["families"].items():
        best = f["best"]
        lines.append(f"| {family} | {len(f['trials'])} of {f['budget']['trials']} | {f['budget']['updates_per_trial']} | "
                     f"{f['budget']['cpu_minutes']} | {'' if best is None else format(best['valid_s_bleu'], '.2f')} | "
                     f"{'' if best is None else describe_params(best['params'])} |")
    lines += ["", "Search space:", ""]
    for family, f in summary["families"].items():
        lines.append(f"- {family}: " + "; ".join(f"{k} {v}" for k, v in f["search_space"].items()))
    lines += ["", "Every trial (numbered 1 to N per family; an interrupted trial is run again under a new journal "
              "number, so the journal's own numbers, in brackets, can skip):", "",
              "| family | trial | valid s-BLEU | valid d-BLEU | CPU min | settings |", "|---|---|---|---|---|---|"]
    for family, f in summary["families"].items():
        for position, tr in enumerate(f["trials"], 1):
            score = "failed" if tr["valid_s_bleu"] is None else f"{tr['valid_s_bleu']:.2f}"
            if tr.get("pruned_at"):
                score = f"stopped at {tr['pruned_at']} updates ({rung_text(tr)})"
            d = tr.get("valid_d_bleu")
            lines.append(f"| {family} | {position} [{tr['number']}] | {score} | {'' if d is None else format(d, '.2f')} | "
                         f"{tr.get('cpu_seconds', 0) / 60:.1f} | {describe_params(tr['params'])} |")
    return "\n".join(lines) + "\n"


def chosen_presets(summary: dict) -> dict:
    """Each finished family's best settings, as the demo reads them (:data:`TUNED_PRESETS`)."""
    presets = {}
    for family, f in summary["families"].items():
        if f["finished"] and f["best"] is not None:
            p = f["best"]["params"]
            sentence, document = split_updates(f["budget"]["updates_per_trial"], p["sentence_share"])
            presets[family] = {"lr": p["lr"], "warmup_updates": int(p["warmup_updates"]), "dropout": p["dropout"],
                               "sentence_updates": sentence, "max_update": document, **size_settings(p),
                               "train_args": fairseq_flags(family, p), "valid_s_bleu": f["best"]["valid_s_bleu"],
                               "trial": f["best"]["number"]}
    return {"command": summary["command"], "families": presets}


def write_presets(summary: dict, path: Path = TUNED_PRESETS, configs: Optional[Path] = DEMO_CONFIGS) -> dict:
    """The demo's presets (``path``) and, in a checkout, the hydra overrides ``configs/tuned/FAMILY.yaml``
    that the family's preset of configs/demo reads when it is there."""
    presets = chosen_presets(summary)
    missing = [f for f in summary["families"] if f not in presets["families"]]
    if missing:
        raise ValueError(f"--write-presets: the search of {', '.join(missing)} has not finished its trials")
    _write_atomic(path, json.dumps(presets, indent=1) + "\n")
    if configs is not None and configs.is_dir():
        for family, preset in presets["families"].items():
            (configs / "tuned").mkdir(exist_ok=True)
            _write_atomic(configs / "tuned" / f"{family}.yaml", hydra_overrides(family, preset, presets["command"]))
    return presets


# where each tuned fairseq-train option lives in a hydra config
HYDRA_KEYS = {"--relu-gamma": "model.relu_gamma", "--relu-gamma-mode": "model.relu_gamma_mode",
              "--relu-no-length-scale": "model.relu_no_length_scale", "--rela-variant": "model.rela_variant",
              "--rela-gain-init": "model.rela_gain_init", "--norm-loss-weight": "criterion.norm_loss_weight",
              "--entropy-margin-weight": "criterion.entropy_margin_weight",
              "--attention-dropout": "model.attention_dropout", "--activation-dropout": "model.activation_dropout",
              "--label-smoothing": "criterion.label_smoothing", "--target-word-dropout": "task.target_word_dropout",
              "--source-word-dropout": "task.source_word_dropout", "--decoder-layerdrop": "model.decoder_layerdrop"}
# the recipe's size fields in a hydra config (both sides of the model alike)
HYDRA_SIZES = {"embed_dim": ("model.encoder_embed_dim", "model.decoder_embed_dim"),
               "ffn_dim": ("model.encoder_ffn_embed_dim", "model.decoder_ffn_embed_dim"),
               "layers": ("model.encoder_layers", "model.decoder_layers"),
               "heads": ("model.encoder_attention_heads", "model.decoder_attention_heads"),
               "max_tokens": ("dataset.max_tokens",)}


def hydra_overrides(family: str, preset: dict, command: str) -> str:
    """A ``# @package _global_`` file with a family's tuned settings, merged after base/setup.yaml."""
    values = {"optimization.lr": [preset["lr"]], "lr_scheduler.warmup_updates": preset["warmup_updates"],
              "model.dropout": preset["dropout"]}
    values.update({key: preset[field] for field, keys in HYDRA_SIZES.items() if field in preset for key in keys})
    argv = preset["train_args"]
    for i, flag in enumerate(argv):
        if flag.startswith("--"):
            takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            values[HYDRA_KEYS[flag]] = _yaml_scalar(argv[i + 1]) if takes_value else True
    nested: Dict[str, dict] = {}
    for key, value in values.items():
        group, name = key.split(".")
        nested.setdefault(group, {})[name] = value
    lines = ["# @package _global_",
             f"# {family}'s tuned settings, written by `{command} --write-presets` (docs/FAMILIES.md);",
             "# read by ../" + family + ".yaml after base/setup.yaml. The demo also splits its updates between",
             f"# sentences ({preset['sentence_updates']}) and 128-token segments ({preset['max_update']}), "
             "which one hydra run does not."]
    for group, items in nested.items():
        lines.append(f"{group}:")
        lines += [f"  {name}: {json.dumps(value)}" for name, value in items.items()]
    return "\n".join(lines) + "\n"


def _yaml_scalar(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


__all__ = ["FAMILY_KNOBS", "Knob", "RECIPE_PRESETS", "SHARED_KNOBS", "TUNED_PRESETS", "TuneOptions", "chosen_presets", "run_search",
           "write_presets"]
