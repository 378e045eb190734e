"""The family tuner (reluformer-study --tune): the same budget for every family, proposals that a
resumed search repeats, interrupted trials resumed, and one real search end to end at toy scale."""
import json

import pytest

from reluformer_mt.experiments import tune


@pytest.fixture(scope="module")
def bible_corpus(tmp_path_factory):
    """The demo's prepared corpus (sentences and 128-token segments), prepared once for the toy
    searches below, which copy it into their OUT/data (its step stamps make them skip preparing)."""
    pytest.importorskip("bible_alignments")
    from reluformer_mt.experiments.demo import DemoOptions, prepare_corpus

    out = tmp_path_factory.mktemp("tune_corpus")
    prepare_corpus(DemoOptions(out=out, families=["softmax"]))
    return out / "data"


def copy_corpus(corpus, out):
    import shutil

    shutil.copytree(corpus, out / "data")


def test_every_family_gets_the_shared_knobs_and_its_own():
    for family in tune.SHARED_FAMILIES:
        names = [k.name for k in tune.knobs_of(family)]
        assert names[:4] == ["lr", "warmup_updates", "dropout", "sentence_share"]
    assert [k.name for k in tune.knobs_of("softmax")] == [k.name for k in tune.SHARED_KNOBS]
    assert "relu_gamma_mode" in [k.name for k in tune.knobs_of("reluformer")]
    assert "rela_gain_init" in [k.name for k in tune.knobs_of("rela")]
    with pytest.raises(ValueError, match="unknown family 'sparsemax'"):
        tune.knobs_of("sparsemax")


def test_split_and_flags():
    assert tune.split_updates(2500, 0.6) == (1500, 1000)
    assert tune.split_updates(2500, 0.3) == (750, 1750)
    params = {"relu_gamma": 0.5, "relu_gamma_mode": "head", "relu_length_scale": False, "norm_loss_weight": 0.05,
              "entropy_margin_weight": 0.0}
    assert tune.fairseq_flags("reluformer", params) == [
        "--relu-gamma", "0.5", "--relu-gamma-mode", "head", "--relu-no-length-scale", "--norm-loss-weight", "0.05",
        "--entropy-margin-weight", "0.0"]
    assert "--relu-no-length-scale" not in tune.fairseq_flags("reluformer", {**params, "relu_length_scale": True})


def test_family_flags_are_fairseq_train_options():
    """Every family knob reaches the model and the criterion as fairseq parses it."""
    from fairseq import options

    from reluformer_mt.experiments.run import PACKAGE_DIR
    from reluformer_mt.plugin import register

    register()
    flags = tune.fairseq_flags("reluformer", {"relu_gamma": 2.0, "relu_gamma_mode": "layer", "relu_length_scale": False,
                                              "norm_loss_weight": 0.3, "entropy_margin_weight": 0.05})
    flags += tune.fairseq_flags("rela", {"rela_variant": "ungated", "rela_gain_init": 0.5})
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "data", "--user-dir", str(PACKAGE_DIR), "--task", "document_translation", "--arch", "reluformer_tiny",
        "--criterion", "reluformer_cross_entropy", *flags])
    assert (args.relu_gamma, args.relu_gamma_mode, args.relu_no_length_scale) == (2.0, "layer", True)
    assert (args.norm_loss_weight, args.entropy_margin_weight) == (0.3, 0.05)
    assert (args.rela_variant, args.rela_gain_init) == ("ungated", 0.5)


def _tell(search, trial, value):
    search.study.tell(trial, value)


def test_a_resumed_search_proposes_what_an_uninterrupted_one_would(tmp_path):
    a = tune.FamilySearch(tune.TuneOptions(out=tmp_path / "a", trials=3, startup_trials=1), "rela")
    b = tune.FamilySearch(tune.TuneOptions(out=tmp_path / "b", trials=3, startup_trials=1), "rela")
    for value in (1.0, 2.0):
        (ta, pa), (tb, pb) = a.ask(), b.ask()
        assert pa == pb
        _tell(a, ta, value)
        _tell(b, tb, value)
    # b reopened from its journal (a new process) proposes what a proposes next
    b = tune.FamilySearch(tune.TuneOptions(out=tmp_path / "b", trials=3, startup_trials=1), "rela")
    assert a.ask()[1] == b.ask()[1]
    # the families' proposals after the preset differ (seeded apart)
    s = tune.FamilySearch(tune.TuneOptions(out=tmp_path / "s", trials=3), "softmax")
    c = tune.FamilySearch(tune.TuneOptions(out=tmp_path / "c", trials=3), "rela")
    for search in (s, c):
        trial, params = search.ask()
        assert params["lr"] == tune.PRESET_PARAMS["lr"]
        _tell(search, trial, 1.0)
    assert s.ask()[1]["lr"] != c.ask()[1]["lr"]


def test_a_killed_trial_is_queued_again_and_does_not_use_budget(tmp_path):
    options = tune.TuneOptions(out=tmp_path, trials=2)
    first = tune.FamilySearch(options, "softmax")
    trial, params = first.ask()  # the search is killed while this trial trains
    assert first.remaining() == 2
    read_only = tune.FamilySearch(options, "softmax", resume=False)  # a report of a running search
    assert read_only.study.trials[0].state.name == "RUNNING"
    again = tune.FamilySearch(options, "softmax")
    assert again.remaining() == 2 and again.study.trials[0].user_attrs["interrupted"]
    resumed, resumed_params = again.ask()
    assert resumed_params == params and again.trial_dir(resumed_params) == first.trial_dir(params)
    _tell(again, resumed, 3.0)
    assert again.remaining() == 1


def test_a_failure_named_by_retry_trials_runs_again_from_a_clean_folder(tmp_path):
    from optuna.trial import TrialState

    options = tune.TuneOptions(out=tmp_path, trials=2)
    first = tune.FamilySearch(options, "softmax")
    trial, params = first.ask()
    stale = first.trial_dir(params) / "checkpoints"
    stale.mkdir(parents=True)  # what a stray worker left there
    first.study.tell(trial, state=TrialState.FAIL)
    assert tune.FamilySearch(options, "softmax").remaining() == 1  # an ordinary failure uses budget
    with pytest.raises(ValueError, match=r"--retry-trials softmax:5: expected a failed trial .* no such trial"):
        tune.FamilySearch(tune.TuneOptions(out=tmp_path, trials=2, retry_trials=[("softmax", 5)]), "softmax")
    retry = tune.TuneOptions(out=tmp_path, trials=2, retry_trials=[("softmax", trial.number)])
    again = tune.FamilySearch(retry, "softmax")
    assert again.remaining() == 2 and not first.trial_dir(params).exists()
    assert (tmp_path / "softmax" / f"{first.trial_dir(params).name}.failed-{trial.number}" / "checkpoints").is_dir()
    tune.FamilySearch(retry, "softmax")  # resumed with the same option: not queued twice
    rerun, rerun_params = again.ask()
    assert rerun_params == params and rerun.user_attrs["retries_trial"] == trial.number
    _tell(again, rerun, 2.0)
    assert again.remaining() == 1 and not tune.FamilySearch(retry, "softmax").ask()[0].user_attrs.get("retries_trial")


def test_retry_trials_names_families_of_the_search():
    from reluformer_mt.cli import tune as cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_checked(["--tune", "rela", "--retry-trials", "rela:x"], cli.check_args)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_checked(["--tune", "rela", "--retry-trials", "softmax:1"], cli.check_args)
    args = cli.build_parser().parse_checked(["--tune", "rela,softmax", "--retry-trials", "softmax:1"], cli.check_args)
    assert args.retry_trials == [("softmax", 1)]


def test_a_search_end_to_end_at_toy_scale(tmp_path, bible_corpus):
    """Two trials of ReLA on the bible corpus (a 16-dim model, 8 updates each, one validation
    chapter): each trains both phases and translates validation only; a second call trains
    nothing; the presets are written only when every family finished."""
    pytest.importorskip("bible_alignments")
    from dataclasses import replace

    from reluformer_mt.experiments.demo import DemoOptions

    options = tune.TuneOptions(out=tmp_path / "tune", families=("rela",), trials=2, total_updates=8, jobs=1,
                               startup_trials=1, valid_chapters=1)
    copy_corpus(bible_corpus, options.out)
    base = DemoOptions(out=options.out, families=["rela"], embed_dim=16, ffn_dim=32, layers=1, heads=2, beam=2,
                       eval_chapters=1, validations=1, max_tokens=2048)
    lines = []
    summary = tune.run_search(options, base, report=lines.append)
    rela = summary["families"]["rela"]
    assert rela["finished"] and len(rela["trials"]) == 2 and rela["budget"]["updates_per_trial"] == 8
    for trial in rela["trials"]:
        assert trial["state"] == "COMPLETE" and 0 <= trial["valid_s_bleu"] <= 100
        assert trial["sentence_updates"] + trial["document_updates"] == 8 and trial["cpu_seconds"] > 0
    assert any("trial 1 (2/2)" in line for line in lines)
    assert "| rela | 2 of 2 | 8 |" in (options.out / "tuning.md").read_text()
    result = json.loads(next((options.out / "rela").glob("trial-*/result.json")).read_text())
    assert result["segments"] > 0  # the validation chapter was translated
    again = tune.run_search(options, base, report=lines.append)  # resumable: nothing left to train
    assert again["families"]["rela"]["trials"] == rela["trials"]
    configs = tmp_path / "configs"
    configs.mkdir()
    presets = tune.write_presets(summary, tmp_path / "presets.json", configs=configs)
    best = presets["families"]["rela"]
    assert best["sentence_updates"] + best["max_update"] == 8 and best["train_args"][0] == "--rela-variant"
    override = (configs / "tuned" / "rela.yaml").read_text()
    assert override.startswith("# @package _global_") and f"rela_variant: \"{best['train_args'][1]}\"" in override
    unfinished = replace(options, trials=3)
    with pytest.raises(ValueError, match="has not finished"):
        tune.write_presets(tune.report_from_journals(unfinished), tmp_path / "presets.json", configs=None)


def test_the_demo_trains_each_family_with_its_tuned_settings(tmp_path):
    """family_settings over the shared preset: the family's lr, split and fairseq options, the
    command line's train_args last; a memory family trains with its base family's; others as before."""
    from reluformer_mt.experiments.demo import DemoOptions, family_run

    tuned = {"rela": {"lr": 0.002, "warmup_updates": 400, "dropout": 0.2, "sentence_updates": 750, "max_update": 1750,
                      "train_args": ["--rela-variant", "ungated"], "valid_s_bleu": 6.0, "trial": 3}}
    o = DemoOptions(out=tmp_path, families=["rela", "softmax"], train_args=["--rela-gain-init", "2"],
                    family_settings=tuned)
    rela = family_run(o, "rela")
    assert (rela.lr, rela.warmup_updates, rela.dropout) == (0.002, 400, 0.2)
    assert [p.updates for p in rela.phases] == [750, 1750]
    assert rela.extra == ("--rela-variant", "ungated", "--rela-gain-init", "2")
    softmax = family_run(o, "softmax")
    assert (softmax.lr, [p.updates for p in softmax.phases]) == (5e-3, [1500, 1000])
    o = DemoOptions(out=tmp_path, families=["softmax+tm"], family_settings={"softmax": tuned["rela"]})
    assert family_run(o, "softmax+tm").lr == 0.002


def test_the_demo_command_reads_the_tuned_presets_unless_told_not_to(tmp_path, monkeypatch):
    from reluformer_mt.cli import demo as demo_cli
    from reluformer_mt.experiments import tune as tune_module

    presets = tmp_path / "tuned_presets.json"
    presets.write_text(json.dumps({"command": "x", "families": {"softmax": {"lr": 0.002, "sentence_updates": 900}}}))
    monkeypatch.setattr(tune_module, "TUNED_PRESETS", presets)
    args = demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d")])
    assert demo_cli.tuned_settings(args) == {"softmax": {"lr": 0.002, "sentence_updates": 900}}
    args = demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d"), "--lr", "0.001"])
    assert demo_cli.tuned_settings(args) == {"softmax": {"sentence_updates": 900}}  # the command line wins
    args = demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d"), "--untuned"])
    assert demo_cli.tuned_settings(args) == {}
    # the reference run: the recipe search's settings, the tuned share of sentence updates on its own budget
    recipe = tmp_path / "tuned_presets_recipe.json"
    monkeypatch.setattr(tune_module, "RECIPE_PRESETS", recipe)
    args = demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d"), "--preset", "reference"])
    assert demo_cli.tuned_settings(args) == {}  # not the quick demo's file
    recipe.write_text(json.dumps({"command": "x", "families": {"rela": {
        "lr": 0.002, "sentence_updates": 2700, "max_update": 1800, "embed_dim": 128}}}))
    args = demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d"), "--preset", "reference"])
    reference = demo_cli.PRESETS["reference"]
    total = reference["sentence_updates"] + reference["max_update"]
    assert demo_cli.tuned_settings(args) == {"rela": {"lr": 0.002, "sentence_updates": int(0.6 * total),
                                                      "max_update": total - int(0.6 * total), "embed_dim": 128}}
    o = demo_cli.options_from_args(args, ["rela"])
    assert o.extra_target == "web" and o.train_lengths == ["sentence", "128", "512", "document"]
    assert o.family_settings["rela"]["embed_dim"] == 128
    assert tune_module.presets_file("recipe") == recipe and tune_module.presets_file("shared") == presets
    args = demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d"), "--preset", "long"])
    assert demo_cli.tuned_settings(args) == {} and demo_cli.options_from_args(args, ["rela"]).extra_target is None
    presets.write_text("[1, 2]")
    with pytest.raises(ValueError, match="tuned_presets.json: expected the tuner's"):
        demo_cli.tuned_settings(demo_cli.build_parser().parse_args(["--out", str(tmp_path / "d")]))


def test_a_run_records_the_cpu_and_the_math_libraries():
    from reluformer_mt.experiments.demo import versions

    v = versions()
    assert v["cpu_model"] and "torch cpu capability" in v["math_libraries"] and v["numpy"]


def test_the_length_study_end_to_end_at_toy_scale(tmp_path):
    """Two families, one seed, verses then whole chapters from the same
    sentence model: every cell scored (BLEU of both decodings, AER, CXMI, zeros), the gaps to
    softmax with a verdict; a second call trains and scores nothing."""
    pytest.importorskip("bible_alignments")
    from reluformer_mt.experiments import lengths
    from reluformer_mt.experiments.demo import DemoOptions

    out = tmp_path / "lengths"
    base = DemoOptions(out=out, families=["rela", "softmax"], embed_dim=16, ffn_dim=32, layers=1, heads=2, beam=2,
                       eval_chapters=1, validations=1, max_tokens=4096, sentence_updates=6, max_update=4,
                       knn=False, pieces_weight=0.0)
    options = lengths.LengthOptions(out=out, families=("rela", "softmax"), seeds=1, lengths=("sentence", "chapter"),
                                    eval_chapters=1, base=base, untuned=True)
    summary = lengths.run_lengths(options, report=lambda line: None)
    cells = summary["families"]["rela"]
    assert set(cells) == {"sentence", "chapter"}
    assert "s_bleu" not in cells["sentence"] and "verse_s_bleu" in cells["sentence"]
    for length in ("chapter",):
        for key in ("s_bleu", "d_bleu", "verse_s_bleu", "aer_best_head", "aer_head_average", "cxmi", "cross_sparsity"):
            assert cells[length][key]["n"] == 1, (length, key)
    trivial = summary["baselines"]  # the lines to beat, on the same test chapters
    assert 0 < trivial["aer"] < 1 and trivial["s_bleu"] > 0 and trivial["cxmi"] == 0
    gap = summary["minus_softmax"]["rela"]["chapter"]["s_bleu"]
    assert gap["verdict"] in ("better", "worse", "within the seed spread")
    # one sentence model for every length; the chapter cell's segments are whole chapters
    seed_dir = out / "rela" / "seed-1"
    assert (seed_dir / "sentence" / "checkpoint_last.pt").exists() and not (seed_dir / "docchapter" / "sentence").exists()
    chapter = json.loads((seed_dir / "docchapter" / "cell.json").read_text())
    assert chapter["segments"] == 1  # one test chapter, one segment
    stamp = (seed_dir / "docchapter" / "cell.json").stat().st_mtime
    lengths.run_lengths(options, report=lambda line: None)
    assert (seed_dir / "docchapter" / "cell.json").stat().st_mtime == stamp
    assert chapter["train_cpu_seconds"] > 0 and "train_seconds" in chapter
    # the cells alone carry the study: without any checkpoint nothing trains again
    for checkpoint in seed_dir.glob("**/*.pt"):
        checkpoint.unlink()
    again = lengths.run_lengths(options, report=lambda line: None)
    assert not list(seed_dir.glob("**/*.pt")) and again["families"] == summary["families"]


def test_the_families_page_states_each_claim_from_the_length_table(tmp_path):
    """The page from a length summary (cells made up here to exercise each verdict) and a tuning
    summary under way: the tables, the plot, a verdict per claim, and the unfinished search said."""
    from reluformer_mt.experiments import families_page, lengths

    def cells(s_bleu, aer, cxmi):
        return {"sentence": {"verse_s_bleu": s_bleu[0], "verse_d_bleu": s_bleu[0] + 3, "aer_best_head": aer,
                             "aer_head_average": aer, "cxmi": cxmi, "cross_sparsity": 0.5},
                "chapter": {"s_bleu": s_bleu[1], "d_bleu": s_bleu[1] + 3, "verse_s_bleu": s_bleu[0],
                            "verse_d_bleu": s_bleu[0] + 3, "aer_best_head": aer, "aer_head_average": aer, "cxmi": cxmi,
                            "cross_sparsity": 0.5}}
    results = {"softmax": {1: cells((5.0, 4.0), 0.70, 0.0), 2: cells((5.2, 4.1), 0.71, 0.001)},
               "reluformer": {1: cells((5.1, 6.0), 0.80, 0.01), 2: cells((4.9, 6.2), 0.81, 0.02)}}
    t = lengths.LengthOptions(out=tmp_path, families=("reluformer", "softmax"), seeds=2, lengths=("sentence", "chapter"))

    class Base:
        family_settings = {}
    summary = lengths.summarise(results, t, Base(), {"s_bleu": 16.4, "d_bleu": 22.2, "aer": 0.77, "cxmi": 0.0})
    assert summary["minus_softmax"]["reluformer"]["chapter"]["s_bleu"]["verdict"] == "better"
    assert summary["minus_softmax"]["reluformer"]["sentence"]["verse_s_bleu"]["verdict"] == "within the seed spread"
    (tmp_path / "lengths.json").write_text(json.dumps(summary))
    tuning = {"command": "reluformer-study --tune softmax", "objective": "valid s-BLEU",
              "families": {"softmax": {"trials": [], "budget": {"trials": 8, "updates_per_trial": 2500, "cpu_minutes": 0},
                                       "search_space": {"lr": "[0.001, 0.012] log"}, "finished": False, "best": None}}}
    (tmp_path / "tuning.json").write_text(json.dumps(tuning))
    out = tmp_path / "FAMILIES.md"
    assert families_page.main(["--tuning", str(tmp_path / "tuning.json"), "--lengths", str(tmp_path / "lengths.json"),
                               "--out", str(out)]) == 0
    page = out.read_text()
    assert "**Under way**: softmax" in page and "| reluformer − softmax |" in page
    assert ("better than softmax on long documents (s-BLEU (document translator)): "
            "whole chapters: confirmed (better over every seed), +2.05") in page
    assert "128-token segments" not in page  # a length the study did not run
    assert "on par with softmax on sentences (s-BLEU (verse by verse)): verses: confirmed (within the seed spread)" in page
    assert "reluformer uses its context (CXMI > 0 nats/token over every seed): whole chapters: confirmed" in page
    assert "softmax uses its context (CXMI > 0 nats/token over every seed): whole chapters: not confirmed" in page
    assert "Floor" not in page and (tmp_path / "families_gap.png").stat().st_size > 1000
    # where no family translates (under a tenth of the copy baseline), the claim says so
    for family in summary["families"].values():
        family["chapter"]["s_bleu"]["mean"] = 1.0
    said = "\n".join(families_page.claims(summary))
    assert "whole chapters: confirmed (better over every seed), +2.05; a floor" in said and "- Floor: at whole chapters" in said
    # each table stands next to what no learning gets
    assert "Baseline, copying the nearest training verse: 16.40" in page and "the diagonal alignment: AER 0.77" in page
    (tmp_path / "bad.json").write_text("[1]")
    assert families_page.main(["--tuning", str(tmp_path / "bad.json")]) == 2
    # a study under way: one seed of softmax lacks its chapter cell
    del results["softmax"][2]["chapter"]
    partial = lengths.summarise(results, t, Base())
    assert (partial["cells_finished"], partial["cells_planned"]) == (7, 8)
    assert partial["families"]["softmax"]["chapter"]["s_bleu"]["n"] == 1
    (tmp_path / "lengths.json").write_text(json.dumps(partial))
    assert families_page.main(["--tuning", str(tmp_path / "tuning.json"), "--lengths", str(tmp_path / "lengths.json"),
                               "--out", str(out)]) == 0
    page = out.read_text()
    assert "7 of 8 cells finished" in page and "(1 of 2 seeds)" in page and "The papers' claims" not in page


def test_every_family_tries_the_quick_preset_once(tmp_path):
    """The shared preset is one of each family's trials (so the search ends at least where it
    stands), queued once however often the search is reopened."""
    from reluformer_mt.experiments.demo import PRESETS

    quick = PRESETS["quick"]
    assert tune.PRESET_PARAMS["lr"] == quick["lr"] and tune.PRESET_PARAMS["warmup_updates"] == quick["warmup_updates"]
    assert tune.split_updates(2500, tune.PRESET_PARAMS["sentence_share"]) == (quick["sentence_updates"], quick["max_update"])
    options = tune.TuneOptions(out=tmp_path, trials=3)
    search = tune.FamilySearch(options, "rela")
    tune.FamilySearch(options, "rela")  # reopened: not queued twice
    trial, params = search.ask()
    assert params == {"lr": 5e-3, "warmup_updates": 200, "dropout": 0.1, "sentence_share": 0.6, "rela_variant": "gated",
                      "rela_gain_init": 1.0}
    search.study.tell(trial, 1.0)
    assert search.ask()[1] != params and tune.FamilySearch(options, "rela").remaining() == 2


def test_the_recipe_space_reaches_the_model_the_flags_and_the_presets(tmp_path):
    names = [k.name for k in tune.knobs_of("softmax", "recipe")]
    assert {"embed_dim", "label_smoothing", "target_word_dropout", "decoder_layerdrop", "max_tokens"} <= set(names)
    assert names[:len(tune.SHARED_KNOBS)] == [k.name for k in tune.SHARED_KNOBS]
    with pytest.raises(ValueError, match="--space: got 'big'"):
        tune.knobs_of("softmax", "big")
    params = {**{k: tune.PRESET_PARAMS[k] for k in names}, "embed_dim": 128, "ffn_ratio": 4, "layers": 3,
              "label_smoothing": 0.3, "target_word_dropout": 0.1}
    flags = tune.fairseq_flags("softmax", params)
    assert flags[flags.index("--label-smoothing") + 1] == "0.3" and "--target-word-dropout" in flags
    assert tune.fairseq_flags("softmax", {k.name: tune.PRESET_PARAMS[k.name] for k in tune.knobs_of("softmax")}) == []
    from reluformer_mt.experiments.demo import DemoOptions, family_options

    o = tune.trial_options(DemoOptions(out=tmp_path, families=["softmax"]), "softmax", params, 2500, tmp_path)
    assert (o.embed_dim, o.ffn_dim, o.layers, o.max_tokens) == (128, 512, 3, 4096)
    summary = {"command": "c", "families": {"softmax": {"finished": True, "budget": {"updates_per_trial": 2500},
                                                         "best": {"params": params, "valid_s_bleu": 9.0, "number": 3}}}}
    preset = tune.chosen_presets(summary)["families"]["softmax"]
    demo = family_options(DemoOptions(out=tmp_path, families=["softmax"], family_settings={"softmax": preset}), "softmax")
    assert (demo.embed_dim, demo.ffn_dim, demo.layers) == (128, 512, 3) and "--label-smoothing" in demo.train_args
    override = tune.hydra_overrides("softmax", preset, "c")
    assert "encoder_embed_dim: 128" in override and "label_smoothing: 0.3" in override and "target_word_dropout" in override


def test_a_trial_behind_its_rung_stops_there(tmp_path, bible_corpus):
    """Successive halving with Optuna's pruner: two finished trials scored 40 at the first rung (2
    sentence updates); the preset trial trains 2 updates, reports its greedy valid s-BLEU and is
    stopped there (its validation loss without smoothing ranks it, -nll_loss < 40), counted in the
    budget and in the table; a second call trains nothing."""
    pytest.importorskip("bible_alignments")
    import optuna

    from reluformer_mt.experiments.demo import DemoOptions

    options = tune.TuneOptions(out=tmp_path / "tune", families=("softmax",), trials=3, total_updates=100, jobs=1,
                               startup_trials=10, valid_chapters=1, space="recipe", first_rung=2, rung_factor=2)
    copy_corpus(bible_corpus, options.out)
    search = tune.FamilySearch(options, "softmax")
    for _ in range(2):
        # as Optuna's pruner records a trial that reached the first rung
        search.study.add_trial(optuna.trial.create_trial(value=40.0, params={}, distributions={},
                                                         intermediate_values={2: 40.0},
                                                         system_attrs={"completed_rung_0": 40.0}))
    # fairseq's validation at the rung on one batch of verses (the test is about the control flow)
    base = DemoOptions(out=options.out, families=["softmax"], beam=2, eval_chapters=1, validations=1,
                       train_args=["--max-valid-steps", "1"])
    lines = []
    summary = tune.run_search(options, base, report=lines.append)
    stopped = [tr for tr in summary["families"]["softmax"]["trials"] if tr["state"] == "PRUNED"]
    assert len(stopped) == 1 and stopped[0]["pruned_at"] == 2 and stopped[0]["rung_valid_nll_loss"] > 0
    assert stopped[0]["params"]["embed_dim"] == 64  # the preset trial, at the quick preset's size
    assert any("stopped at 2 updates" in line for line in lines)
    trial_dir = next((options.out / "softmax").glob("trial-*"))
    rung = json.loads((trial_dir / "rungs.json").read_text())["2"]  # both measures, ranked by -nll_loss
    assert rung == {"nll_loss": stopped[0]["rung_valid_nll_loss"], "s_bleu": stopped[0]["rung_valid_s_bleu"]}
    assert "valid nll" in (options.out / "tuning.md").read_text()
    assert not (trial_dir / "checkpoints" / "softmax" / "document").exists()  # the document phase never ran
    assert "stopped at 2 updates" in (options.out / "tuning.md").read_text()
    again = tune.run_search(options, base, report=lines.append)
    assert again["families"]["softmax"]["trials"] == summary["families"]["softmax"]["trials"]


def test_rungs_rank_by_one_measure_per_search(tmp_path):
    """A rung keeps both measures; -nll_loss ranks by default, s-BLEU with --rung-metric bleu; rungs
    of a search that stored s-BLEU alone are refused under nll in one line naming the option."""
    from reluformer_mt.experiments.recipe import rung_value

    record = tmp_path / "rungs.json"
    assert rung_value({"nll_loss": 6.5, "s_bleu": 0.04}, "nll", record) == -6.5
    assert rung_value({"nll_loss": 6.5, "s_bleu": 0.04}, "bleu", record) == 0.04
    assert rung_value(3.42, "bleu", record) == 3.42
    with pytest.raises(ValueError, match="rungs.json: its rungs hold greedy s-BLEU only; resume it with --rung-metric bleu"):
        rung_value(3.42, "nll", record)
