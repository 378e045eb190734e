"""``reluformer-eval``: evaluation subcommands (definitions: docs/METHODS.md section 4).

    cat hyp.txt | reluformer-eval bleu ref.txt -b                  # the score alone, as sacrebleu ref.txt -b
    reluformer-eval bleu ref.txt -i base.txt new.txt -m bleu chrf --paired-bs   # sacreBLEU's paired bootstrap
    reluformer-eval bleu test.de -i gen.out --segments data-bin/test.segments.tsv ...
    reluformer-eval aer  --gold enfr.gold --gold-base 1 --pred pred.txt --lengths enfr.src-tgt
    reluformer-eval align --checkpoint ckpt.pt --src test.words.grc --tgt test.words.en --output pred.align \
        --gold test.gold.align --gold-base 0 --plot aer.png
    reluformer-eval attn-stats --checkpoint a/ckpt.pt b/ckpt.pt --split test --plot sparsity.png
    reluformer-eval contrastive --checkpoint ckpt.pt --suite contrapro --suite-dir ../shared/data/contrapro_ctx1
    reluformer-eval cxmi --checkpoint ckpt.pt --data data-bin/doc --split test

Every subcommand prints a readable table and, with ``--json PATH``, writes a JSON report. A new
subcommand is a triple (help, add_arguments, run) registered in ``SUBCOMMANDS``; ``run(args)`` returns
the report dict (so it is callable from Python) and prints its table. Exit codes: 0, 2 for a usage
or input error (``reluformer_mt.cli.checks``; sacreBLEU exits 1 for an input error: this package
keeps one convention for all its commands, see docs/USAGE.md).
"""
import argparse
import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from reluformer_mt.cli.checks import (EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, OneLineParser, add_device_option,
                                     add_spm_model_option, check_checkpoint_file, check_distinct_files, check_input_file,
                                     check_output_file,
                                     non_negative_int, percent, percent_list, positive_int, quiet_logging, resolve_device, write_error)
from reluformer_mt.data.documents import FORMAT as DOCMT
from reluformer_mt.data.wording import counted
from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation import bleu as bleu_lib
from reluformer_mt.evaluation.reports import format_table, write_json

LEVELS = {"s": "sentence", "d": "document", "seg": "segment"}


# ---------------------------------------------------------------------------------------------- bleu

def bleu_tokenizers() -> List[str]:
    """sacreBLEU's tokenizer names (an unknown one is a KeyError inside sacreBLEU)."""
    from sacrebleu.metrics.bleu import BLEU

    return list(BLEU.TOKENIZERS)


def check_tokenizer(name: str) -> None:
    """Build sacreBLEU's tokenizer before any work: ja-mecab, ko-mecab and flores need extra
    packages, and sacreBLEU says so in a multi-line RuntimeError (a traceback through us)."""
    from sacrebleu.metrics.bleu import BLEU

    try:
        BLEU(tokenize=name)
    except (ImportError, RuntimeError) as e:
        why = " ".join(str(e).split())
        raise ValueError(f"--tokenize {name}: its extra dependencies are not installed ({why})") from None
    except OSError as e:  # flores101/flores200 download their SentencePiece model on first use
        why = " ".join(str(getattr(e, "reason", None) or e.strerror or e).split())
        raise ValueError(f"--tokenize {name}: sacreBLEU downloads its SentencePiece model on first use and could "
                         f"not ({why}); run once with network access, or pick another --tokenize") from None


def add_bleu_args(p: argparse.ArgumentParser) -> None:
    # the sacrebleu command's shape: references positional, the hypothesis on standard input or -i
    p.add_argument("refs", nargs="*", metavar="REF",
                   help="reference file(s): a docmt file (<d> starts each document) or one sentence a line (raw, "
                        "untokenised); several: sacreBLEU's multi-reference scores (parallel files)")
    p.add_argument("-i", "--input", "--hyp", dest="hyp", nargs="+", metavar="HYP",
                   help="hypotheses: fairseq-generate output, a docmt file or one sentence a line; '-' = standard "
                        "input (a pipe is read once); several files: several systems (default: standard input)")
    p.add_argument("--ref", help="a reference file, as the positional REF (the option of earlier versions); '-' = "
                                 "standard input")
    p.add_argument("-m", "--metrics", nargs="+", default=["bleu"], choices=["bleu", "chrf", "chrf++", "ter"],
                   help="metrics, as sacreBLEU's -m; chrf++ (not a sacreBLEU name) = chrf with --chrf-word-order 2, "
                        "so chrF and chrF++ can be asked together; TER is slow on long items: never over whole documents")
    p.add_argument("--ter-max-words", type=non_negative_int, default=bleu_lib.TER_MAX_WORDS, metavar="N",
                   help="TER: a line of more than N words (a whole talk on a line) is scored without TER's shift "
                        "search, its edit distance alone (an upper bound; said in a note); 0: the shift search on "
                        "every line, as sacreBLEU (minutes per line of thousands of words)")
    p.add_argument("--chrf-word-order", type=int, default=0, choices=[0, 2],
                   help="chrF's word n-grams: 2 = chrF++ (as sacreBLEU's --chrf-word-order)")
    p.add_argument("-w", "--width", type=non_negative_int, default=1, metavar="N",
                   help="decimals of the printed scores (sacreBLEU's -w)")
    p.add_argument("-b", "--score-only", action="store_true",
                   help="print only the score(s) on standard output, one number a line: each metric in the order of "
                        "-m, each level in the order of --levels (several systems: a line per system); notes go to "
                        "standard error (sacrebleu -b)")
    p.add_argument("--paired-bs", action="store_true",
                   help="paired bootstrap resampling (sacreBLEU's own implementation) of every system against the "
                        "first (the baseline), at each level scored; needs two or more -i files")
    p.add_argument("--paired-bs-n", type=positive_int, default=1000, metavar="N", help="bootstrap resamples")
    p.add_argument("--hyp-format", default="auto", choices=["auto", "generate", DOCMT, bleu_lib.LINES, "plain"],
                   help="auto: <d> on the first non-blank line = docmt; S-/H- lines = generate; a file with blank "
                        "lines = lines (a blank line between documents, reluformer-translate's lines output) when "
                        "the reference has documents too or its sentences are the lines less the blank ones; "
                        "else plain (a blank line is an empty sentence)")
    p.add_argument("--hyp-doc-ids", help="doc id per line of a plain hypothesis")
    p.add_argument("--ref-format", default="auto", choices=["auto", DOCMT, bleu_lib.LINES, "plain"],
                   help="as --hyp-format: a reference with blank lines is read as lines when the hypothesis has "
                        "documents")
    p.add_argument("--ref-doc-ids", help="doc id per line of a plain reference (each reference, with several)")
    p.add_argument("--ref-from-generate", action="store_true",
                   help="use the T- lines of the hypothesis as reference (binarised targets: may hold <unk>)")
    p.add_argument("--segments", help="{split}.segments.tsv of the generated split (sample id order)")
    p.add_argument("--separator", default=bleu_lib.SEPARATOR, help="sentence separator token inside segments")
    p.add_argument("--pieces", default="auto", choices=["auto", "yes", "no"],
                   help="generate output holds SentencePiece pieces (yes), text from --post-process sentencepiece "
                        "(no), or detect by '▁' (auto)")
    p.add_argument("--levels", default="s,d", help="comma list of s (s-BLEU), d (d-BLEU over documents: needs document "
                                                   "boundaries on both sides), seg (d-BLEU over segments)")
    p.add_argument("--match-docs-by", default="id", choices=["id", "order"],
                   help="pair hypothesis and reference documents by id or by position (<d> files number documents 0, 1, ...)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="documents whose sentence counts differ are reported, not an error; then only d-BLEU is scored")
    p.add_argument("--tokenize", default="13a", choices=bleu_tokenizers(), help="sacreBLEU tokenizer")
    p.add_argument("--detokenize", default="none", choices=list(bleu_lib.DETOKENIZERS),
                   help="moses: detokenise hypotheses and references with sacremoses first (for tokenised "
                        "references such as the bible's 'vineyard .', so the scores compare with other work)")
    p.add_argument("--detokenize-lang", default="en", help="language of the Moses detokeniser's rules")
    p.add_argument("--lowercase", action="store_true")


def _metric_keys(args) -> List[str]:
    """The report keys of the asked metrics, in -m's order ('chrf' is chrF++ with --chrf-word-order 2)."""
    keys = [{"bleu": "scores", "chrf": "chrf++" if args.chrf_word_order else "chrf", "chrf++": "chrf++", "ter": "ter"}[m]
            for m in args.metrics]
    return list(dict.fromkeys(keys))


def print_bleu_report(report: dict, width: int = 2) -> None:
    """The definition, the BLEU and chrF tables with signatures, mismatches and notes."""
    print(report["definition"])
    if report["scores"]:
        rows = [(r.name, r.score, r.n_items, r.verbose) for r in report["scores"].values()]
        print(format_table(["metric", "BLEU", "items", "details"], rows, digits=width))
        for r in report["scores"].values():
            print(f"{r.name} signature: BLEU|{r.signature}")
    if report.get("chrf"):
        print(format_table(["metric", "chrF", "items"], [(r.name, r.score, r.n_items) for r in report["chrf"].values()],
                           digits=width))
        print(f"chrF signature: chrF2|{next(iter(report['chrf'].values())).signature}")
    if report.get("chrf++"):
        print(format_table(["metric", "chrF++", "items"],
                           [(r.name, r.score, r.n_items) for r in report["chrf++"].values()], digits=width))
        print(f"chrF++ signature: chrF2++|{next(iter(report['chrf++'].values())).signature}")
    if report.get("ter"):
        print(format_table(["metric", "TER (lower is better)", "items"],
                           [(r.name, r.score, r.n_items) for r in report["ter"].values()], digits=width))
        print(f"TER signature: TER|{next(iter(report['ter'].values())).signature}")
    if report["mismatches"]:
        n = len(report["mismatches"])
        print(f"\n{counted(n, 'document')} {'differs' if n == 1 else 'differ'} in sentence count:")
        print(format_table(["doc id", "hyp sentences", "ref sentences"],
                           [(m["doc_id"], m["hyp_sentences"], m["ref_sentences"]) for m in report["mismatches"]]))
    for note in report["notes"]:
        print(f"note: {note}")


def paired_bootstrap(reports: Sequence[dict], names: Sequence[str], args) -> dict:
    """sacreBLEU's paired bootstrap resampling (``sacrebleu.significance.PairedTest``) of each
    system against the first, per level; returns {level: rows} and prints the table."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    out = {}
    for level in reports[0]["items"]:
        if any(level not in r["items"] for r in reports):
            continue
        refs = reports[0]["items"][level][1]
        for name, report in zip(names[1:], reports[1:]):
            if report["items"][level][1] != refs:
                raise ValueError(f"--paired-bs: {name} pairs with the references differently from {names[0]} "
                                 f"({level}s in another order?); the systems must cover the same documents in the same order")
        metrics = {}
        for m in _metric_keys(args):  # fresh metric objects: PairedTest caches the references in them
            metrics[m] = (BLEU(tokenize=args.tokenize, lowercase=args.lowercase) if m == "scores" else
                          CHRF(lowercase=args.lowercase, word_order=2 if m == "chrf++" else 0) if m.startswith("chrf")
                          else bleu_lib.BoundedTER(args.ter_max_words))
        test = PairedTest([(n, r["items"][level][0]) for n, r in zip(names, reports)], metrics, refs,
                          test_type="bs", n_samples=args.paired_bs_n)
        signatures, results = test()
        header = ["system"] + [f"{metric} (mean ± 95% CI, p)" for metric in results if metric != "System"]
        rows = []
        for k, system in enumerate(results["System"]):
            row = [system + (" (baseline)" if k == 0 else "")]
            for metric, values in results.items():
                if metric == "System":
                    continue
                v = values[k]
                p = "" if v.p_value is None else f", p = {v.p_value:.4f}"
                row.append(f"{v.score:.{args.width}f} ({v.mean:.{args.width}f} ± {v.ci:.{args.width}f}{p})")
            rows.append(row)
        print(f"paired bootstrap resampling ({args.paired_bs_n} resamples, sacreBLEU) over {level}s:")
        print(format_table(header, rows))
        for metric, sig in signatures.items():
            print(f"{metric} signature: {sig}")
        out[level] = {"signatures": {m: str(sig) for m, sig in signatures.items()},
                      "systems": [{"system": system, **{m: {"score": results[m][k].score, "mean": results[m][k].mean,
                                                          "ci": results[m][k].ci, "p_value": results[m][k].p_value}
                                                      for m in results if m != "System"}}
                                  for k, system in enumerate(results["System"])]}
    return out


def run_bleu(args) -> dict:
    levels = []
    for lv in args.levels.split(","):
        if lv.strip() not in LEVELS:
            raise ValueError(f"--levels: unknown level {lv!r}, expected a comma list of s, d, seg")
        levels.append(LEVELS[lv.strip()])
    refs = ([args.ref] if args.ref else []) + list(args.refs)
    hyps = args.hyp or ["-"]
    if not refs and not args.ref_from_generate:
        raise ValueError("give the reference file(s): reluformer-eval bleu REF [REF ...] < HYP")
    if args.paired_bs and len(hyps) < 2:
        raise ValueError("--paired-bs compares systems: give two or more -i files (the first is the baseline)")
    for path in [*hyps, *refs, args.hyp_doc_ids, args.ref_doc_ids]:  # every input named before any is read
        if path and path != "-" and not os.path.exists(path):
            raise FileNotFoundError(f"{path}: file not found")
        if path and path != "-" and os.path.isdir(path):
            raise ValueError(f"{path}: a directory, expected a text file")
    if sum(1 for x in [*hyps, *refs] if x == "-") > 1:
        raise ValueError("only one input can be standard input ('-')")
    keys = _metric_keys(args)
    names = [bleu_lib.input_label(h) for h in hyps]
    reports = []
    for hyp in hyps:
        reports.append(bleu_lib.bleu_from_files(
            hyp, refs[0] if refs else None, hyp_format=args.hyp_format, ref_format=args.ref_format,
            hyp_doc_ids=args.hyp_doc_ids, ref_doc_ids=args.ref_doc_ids, segments=args.segments,
            separator=args.separator, pieces=args.pieces, ref_from_generate=args.ref_from_generate, levels=levels,
            match=args.match_docs_by, allow_mismatch=args.allow_mismatch, tokenize=args.tokenize,
            lowercase=args.lowercase, detokenize=args.detokenize, detokenize_lang=args.detokenize_lang,
            more_refs=refs[1:], metrics=[k if k != "scores" else "bleu" for k in keys], ter_max_words=args.ter_max_words))
    for name, report in zip(names, reports):
        if args.score_only:  # scores in the order asked; a level that could not be scored prints nothing
            numbers = [f"{report[key][level].score:.{args.width}f}" for key in keys for level in levels
                       if level in report[key]]
            print((" " if len(reports) > 1 else "\n").join(numbers))
            for note in report["notes"]:
                print(f"reluformer-eval bleu: note: {name}: {note}", file=sys.stderr)
        else:
            if len(reports) > 1:
                print(f"== {name}")
            print_bleu_report(report, args.width)
    paired = paired_bootstrap(reports, names, args) if args.paired_bs else None
    for report in reports:
        report.pop("items")  # what was scored: for the paired test, not the JSON report
    if len(reports) == 1 and not paired:
        return reports[0]
    return {"systems": dict(zip(names, reports)), **({"paired_bootstrap": paired} if paired else {})}


# ---------------------------------------------------------------------------------------------- aer

def add_aer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gold", required=True, help="gold links, one sentence a line ('i-j' sure, 'ipj' possible)")
    p.add_argument("--gold-base", type=int, required=True, choices=[0, 1],
                   help="index base of the gold file, required, never guessed (awesome-align sets: 1; Biçici "
                        "de-en.wa: 0); a warning says when the links look like the other base")
    p.add_argument("--gold-format", default="pharaoh", choices=["pharaoh", "naacl"],
                   help="pharaoh: links per line; naacl: 'sent src tgt [S|P]' a line (1-based sentences, --gold-base words)")
    p.add_argument("--possible-mark", default="p", help="mark of possible links in the gold file (3p4)")
    pred = p.add_mutually_exclusive_group(required=True)
    pred.add_argument("--pred", help="predicted links, one sentence a line, 'i-j' source first")
    pred.add_argument("--baseline", choices=["diagonal"], help="score a baseline instead (needs sentence lengths)")
    p.add_argument("--pred-base", type=int, default=0, choices=[0, 1], help="index base of --pred (align writes 0)")
    p.add_argument("--lengths", help="'source ||| target' token file, to check that links lie inside sentences")
    p.add_argument("--src", help="source token file (with --tgt, instead of --lengths)")
    p.add_argument("--tgt", help="target token file")
    p.add_argument("--unchecked-gold", action="store_true",
                   help="range-check only the predictions, not the gold (Biçici's de-en.wa line 63 has the link 12-16 "
                        "in a 13-token sentence pair)")
    p.add_argument("--gold-swap", action="store_true",
                   help="gold links list the target index first (Biçici's de-en.wa scored in the en->de direction)")
    p.add_argument("--write-pred", help="write the scored predictions (e.g. the baseline), 0-based")


def run_aer(args) -> dict:
    if bool(args.src) != bool(args.tgt):
        raise ValueError("--src and --tgt go together")
    if args.lengths and args.src:
        raise ValueError("give --lengths or --src/--tgt, not both")
    lengths = aer_lib.read_lengths(args.lengths) if args.lengths else (
        aer_lib.read_lengths(args.src, args.tgt) if args.src else None)
    if args.pred:
        pred = aer_lib.read_predictions(args.pred, args.pred_base)
    else:
        if lengths is None:
            raise ValueError("--baseline needs sentence lengths (--lengths or --src/--tgt)")
        pred = [aer_lib.diagonal_alignment(ns, nt) for ns, nt in lengths]
    if args.gold_format == "naacl":
        gold = aer_lib.read_gold_naacl(args.gold, len(pred), word_base=args.gold_base)
    else:
        gold = aer_lib.read_gold(args.gold, args.gold_base, args.possible_mark)
    if len(gold) != len(pred):
        raise ValueError(f"{args.gold} has {len(gold)} sentences but {args.pred or 'the baseline'} has {len(pred)}")
    gold_lengths = [(nt, ns) for ns, nt in lengths] if lengths and args.gold_swap else lengths
    hint = aer_lib.other_base_hint([p for _, p in gold], args.gold_base, gold_lengths)
    if hint:
        print(f"reluformer-eval aer: warning: --gold-base {args.gold_base}, but {hint}; check --gold-base", file=sys.stderr)
    if lengths is not None:
        if not args.unchecked_gold:  # in the file's own orientation, so the error names its indices
            aer_lib.check_ranges([p for _, p in gold], gold_lengths, args.gold, args.gold_base)
        if args.pred:
            aer_lib.check_ranges(pred, lengths, args.pred, args.pred_base)
    if args.gold_swap:
        gold = [({(j, i) for i, j in s}, {(j, i) for i, j in p}) for s, p in gold]
    if args.write_pred:
        with open(args.write_pred, "w", encoding="utf-8") as f:
            f.writelines(aer_lib.format_links(links) + "\n" for links in pred)
    result = aer_lib.corpus_aer(pred, gold)
    print(f"AER (Och & Ney 2003), corpus level, gold {args.gold} ({args.gold_base}-based), "
          f"predictions {args.pred or args.baseline + ' baseline'}")
    print(format_table(["sentences", "|A|", "|S|", "|P|", "precision", "recall", "AER"],
                       [(result.n_sentences, result.n_predicted, result.n_sure, result.n_possible,
                         result.precision, result.recall, result.aer)], digits=4))
    return {"gold": args.gold, "gold_base": args.gold_base, "predictions": args.pred or f"{args.baseline} baseline",
            "range_checked": ("predictions" if args.unchecked_gold else "gold and predictions") if lengths else "no", "result": result}

# ---------------------------------------------------------------------------------------------- models

def add_model_args(p: argparse.ArgumentParser) -> None:
    """Checkpoint and tokenisation options shared by align and attn-stats."""
    p.add_argument("--checkpoint", required=True, nargs="+", help="fairseq checkpoint(s) of reluformer models")
    p.add_argument("--names", nargs="+", help="display names of the checkpoints (default: their folder names)")
    p.add_argument("--data", help="data directory with the dictionaries (default: the one the checkpoint was trained on)")
    add_spm_model_option(p, "the data directory's prepared.json's, else one token per word")
    p.add_argument("--max-tokens", type=positive_int, default=4000, help="force-decoding batch size in tokens")
    add_device_option(p)


def add_text_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", help="source file, one tokenised sentence a line (words split on spaces)")
    p.add_argument("--tgt", help="target (reference) file, one tokenised sentence a line")
    p.add_argument("--pairs", help="'source ||| target' file (e.g. awesome-align's *.src-tgt), instead of --src/--tgt")


def add_align_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_text_args(p)
    p.add_argument("--layer", default="all", help="decoder layer, 1-based, or 'all' (one output file per layer)")
    p.add_argument("--head", default="average", help="cross-attention head, 1-based, or 'average' (mean over heads)")
    p.add_argument("--shifted", action="store_true",
                   help="shifted attention: the row of the step where the target word is the decoder input")
    p.add_argument("--output", help="predicted links, one 0-based 'i-j' line per pair, source first "
                                    "(pred.align -> pred.layerN.align with --layer all)")
    p.add_argument("--gold", help="gold links: prints AER of the selection and the per-layer AER table")
    p.add_argument("--gold-base", type=int, choices=[0, 1],
                   help="index base of --gold, required with it (awesome-align sets: 1; Biçici de-en.wa, bible: 0)")
    p.add_argument("--possible-mark", default="p", help="mark of possible links in the gold file (3p4)")
    p.add_argument("--gold-swap", action="store_true",
                   help="gold links list the target index first (e.g. Biçici's de-en.wa with an en->de model)")
    p.add_argument("--unchecked-gold", action="store_true", help="do not range-check the gold links")
    p.add_argument("--plot", help="PNG of AER per layer (best head, head average; normal, shifted); needs --gold")


def _print_model(name: str, model: dict) -> None:
    fns = ", ".join(f"{k} {v}" for k, v in model["attention_functions"].items())
    print(f"{name}: {model['checkpoint']} ({model['arch']}; {fns}; {model['tokens']})")


def parse_layer(text: str):
    """'all' or a 1-based layer number (checked against the model by the library)."""
    if str(text).lower() == "all":
        return "all"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--layer: expected 'all' or a layer number, got {text!r}") from None


def parse_head(text: str) -> Optional[int]:
    """'average' (None) or a 1-based head number (checked against the model by the library)."""
    if str(text).lower() in ("average", "avg", "mean"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--head: expected 'average' or a head number, got {text!r}") from None


def run_align(args) -> dict:
    from reluformer_mt.evaluation import align as align_lib

    report = align_lib.run_align(
        args.checkpoint, src=args.src, tgt=args.tgt, pairs=args.pairs, data=args.data, spm_models=args.spm_model,
        layer=parse_layer(args.layer), head=parse_head(args.head), shifted=args.shifted, output=args.output, gold=args.gold,
        gold_base=args.gold_base, possible_mark=args.possible_mark, gold_swap=args.gold_swap,
        unchecked_gold=args.unchecked_gold, plot=args.plot, names=args.names, max_tokens=args.max_tokens,
        device=args.device)
    print(f"alignments from cross-attention: {report['sentences']} sentence pairs from {report['input']}, "
          f"{report['mode']} attention, layer {report['layer']}, head {report['head']}")
    for name, entry in report["models"].items():
        _print_model(name, entry["model"])
        rows = []
        for sel in entry["selected"]:
            a = sel.get("aer")
            rows.append([sel["layer"], sel["head"], sel["mode"], sel["links"]] +
                        ([a["precision"], a["recall"], a["aer"]] if a else []) + [sel.get("output", "-")])
        headers = ["layer", "head", "mode", "links"] + (["precision", "recall", "AER"] if args.gold else []) + ["output"]
        print(format_table(headers, rows, digits=4))
        if "aer_per_layer" in entry:
            print(f"\nAER per layer, {name} (best head = lowest AER on these gold links):")
            print(format_table(align_lib.AER_HEADERS, align_lib.aer_rows(entry["aer_per_layer"]), digits=4))
    if "plot" in report:
        print(f"plot written to {report['plot']}")
    return report


def add_attn_stats_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--split", default="test", help="binarised split of the data directory (unless --src/--tgt or --pairs)")
    add_text_args(p)
    p.add_argument("--limit", type=positive_int, help="use only the first N examples")
    p.add_argument("--kinds", default="enc-self,dec-self,cross", help="comma list of enc-self, dec-self, cross")
    p.add_argument("--top-percent", type=percent, default=10.0, help="top-score ratio: share of mass in the top P%% keys")
    p.add_argument("--per-head", action="store_true", help="also print a row per layer and head")
    p.add_argument("--plot", help="PNG of the sparsity rate per layer (a line per model and attention)")


KIND_ALIASES = {"cross": "cross", "decoder_self": "decoder_self", "dec-self": "decoder_self",
                "decoder": "decoder_self", "encoder_self": "encoder_self", "enc-self": "encoder_self",
                "encoder": "encoder_self"}


def parse_kinds(text: str, order: Sequence[str]) -> List[str]:
    """'enc-self,cross' -> the library's kind names, in the library's ``order``."""
    kinds = []
    for k in text.split(","):
        k = k.strip()
        if k not in KIND_ALIASES:
            raise ValueError(f"--kinds: unknown attention {k!r}, expected a comma list of cross, dec-self, enc-self")
        kinds.append(KIND_ALIASES[k])
    return [k for k in order if k in kinds]


def run_attn_stats(args) -> dict:
    from reluformer_mt.evaluation import attn_stats as stats_lib

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be positive, got {args.limit}")
    report = stats_lib.run_attn_stats(
        args.checkpoint, data=args.data, split=args.split, src=args.src, tgt=args.tgt, pairs=args.pairs,
        spm_models=args.spm_model, kinds=parse_kinds(args.kinds, stats_lib.extract.KINDS), top_percent=args.top_percent,
        limit=args.limit, names=args.names, plot=args.plot, max_tokens=args.max_tokens, device=args.device)
    print(f"attention statistics on {report['data']}; {report['definitions']}")
    for name, entry in report["models"].items():
        _print_model(name, entry["model"])
        print(f"  {entry['examples']} examples")
    for kind in report["kinds"]:
        if not any(kind in e["stats"] for e in report["models"].values()):
            continue
        print(f"\n{stats_lib.KIND_LABELS[kind]} attention, per layer (heads pooled):")
        print(format_table(*stats_lib.layer_table(report, kind), digits=3))
        if args.per_head:
            print(f"\n{stats_lib.KIND_LABELS[kind]} attention, per head:")
            print(format_table(*stats_lib.head_table(report, kind), digits=3))
    if "plot" in report:
        print(f"plot written to {report['plot']}")
    return report


# ---------------------------------------------------------------------------------------------- context use

def _add_scoring_args(p: argparse.ArgumentParser) -> None:
    """One checkpoint and its force-decoding options (contrastive, cxmi)."""
    p.add_argument("--checkpoint", required=True, help="fairseq checkpoint of a reluformer model")
    p.add_argument("--data", help="prepared directory with dictionaries, prepared.json and SentencePiece model "
                                  "(default: the one the checkpoint was trained on)")
    add_spm_model_option(p, "the data directory's prepared.json's")
    p.add_argument("--max-tokens", type=positive_int, default=4000, help="force-decoding batch size in tokens")
    p.add_argument("--batch-size", type=positive_int, default=64, help="at most this many sequences a batch")
    add_device_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")


def add_contrastive_args(p: argparse.ArgumentParser) -> None:
    _add_scoring_args(p)
    p.add_argument("--suite", required=True, choices=["contrapro", "discevalmt"],
                   help="contrapro: en-de pronouns (Müller et al. 2018); discevalmt: en-fr anaphora and lexical choice "
                        "(Bawden et al. 2018)")
    p.add_argument("--suite-dir", required=True, help="folder of the suite files (e.g. ../shared/data/contrapro_ctx1)")
    p.add_argument("--context", default="previous", choices=["previous", "none"],
                   help="previous: the previous sentence as the document model's context (source and target, with the "
                        "separator); none: the same model as a sentence-level one")
    p.add_argument("--score", default="sum", choices=["sum", "mean"],
                   help="sum (default): log-probability of the candidate, the likelihood comparison the test asks for; "
                        "mean: per token, as contextual-mt does, which can prefer a longer, less probable candidate "
                        "(the report gives the other score's accuracy too)")
    p.add_argument("--limit", type=positive_int, help="only the first N examples (of each DiscEvalMT set)")
    p.add_argument("--any-languages", action="store_true",
                   help="score a checkpoint whose language pair differs from the suite's (ContraPro en->de, "
                        "DiscEvalMT en->fr) instead of stopping; only a check of the pipeline")


def run_contrastive(args) -> dict:
    from reluformer_mt.evaluation import contrastive

    report = contrastive.run_contrastive(
        args.checkpoint, args.suite, args.suite_dir, context=args.context, score=args.score, data=args.data,
        spm_models=args.spm_model, limit=args.limit, max_tokens=args.max_tokens, batch_size=args.batch_size,
        device=args.device, progress=False if args.no_progress else None, any_languages=args.any_languages)
    _print_model("model", report["model"])
    print(report["definition"])
    for note in report["notes"]:
        print(f"note: {note}")
    print(format_table(contrastive.table_headers(report), contrastive.table_rows(report)))
    if report["no_context_check"]:
        for name, entry in report["sets"].items():
            exact = entry["correct"] * 2 == entry["examples"]
            print(f"no-context check, {name}: {entry['accuracy']:.2f} % "
                  + ("= 50 % exactly: scoring leaks no answer" if exact else f"!= 50 % ({entry['ties']} ties count as wrong)"))
    return report


def add_cxmi_args(p: argparse.ArgumentParser) -> None:
    _add_scoring_args(p)
    p.add_argument("--split", default="test", help="binarised split of the prepared document-level directory (valid, test)")
    p.add_argument("--context-sentences", type=positive_int, default=1, help="previous sentences of the document given as context")
    p.add_argument("--limit-docs", type=positive_int, help="only the first N documents")
    p.add_argument("--bootstrap", type=positive_int, default=1000, help="bootstrap resamples for the 95%% interval")
    p.add_argument("--seed", type=non_negative_int, default=1, help="bootstrap seed")


def run_cxmi(args) -> dict:
    from reluformer_mt.evaluation import cxmi

    report = cxmi.run_cxmi(
        args.checkpoint, data=args.data, split=args.split, context_sentences=args.context_sentences,
        spm_models=args.spm_model, limit_docs=args.limit_docs, max_tokens=args.max_tokens, batch_size=args.batch_size,
        device=args.device, n_boot=args.bootstrap, seed=args.seed, progress=False if args.no_progress else None)
    _print_model("model", report["model"])
    print(report["definition"])
    print(f"{report['sentences']} sentences with context ({report['tokens']} target tokens) in {report['documents']} "
          f"documents of {report['split']}; {report['sentences_helped']} made more likely by the context; "
          f"{report['skipped_too_long']} left out (context does not fit the model's positions)")
    print(format_table(*cxmi.table(report), digits=4))
    return report


# ---------------------------------------------------------------------------------------------- memory

def add_memory_stats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint of a reluformer model")
    p.add_argument("--data", required=True, help="fairseq binarised data directory")
    p.add_argument("--split", default="valid", help="split to run over (default valid)")
    p.add_argument("--top-percent", type=percent_list, default="0.2,1,10", help="comma list of p for the top-p%% score ratio")
    p.add_argument("--max-tokens", type=positive_int, default=4000)
    p.add_argument("--max-batches", type=positive_int, help="stop after this many batches")
    p.add_argument("--max-rows", type=positive_int, default=2000, help="rows per layer used for the anisotropy")
    add_device_option(p)


def run_memory_stats(args) -> dict:
    from reluformer_mt.memory.maintenance.stats import memory_stats_report

    return memory_stats_report(args.checkpoint, args.data, args.split, args.top_percent, max_tokens=args.max_tokens,
                               max_batches=args.max_batches, max_rows=args.max_rows, device=args.device)


# ---------------------------------------------------------------------------------------------- report

def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, help="a report folder (e.g. runs/demo/report): report.json, table.json, "
                                                "metrics.json, sentences.json, alignments.json, *.png, each if there")
    p.add_argument("--output", help="the page to write (default: DIR/index.html)")


def run_report(args) -> dict:
    from reluformer_mt.evaluation.html_report import write_html_report

    page = write_html_report(args.dir, args.output)
    print(f"HTML report written to {page} (self-contained: open it from the file system)")
    return {"dir": args.dir, "page": str(page)}


# ---------------------------------------------------------------------------------------------- main

SUBCOMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "bleu": ("s-BLEU and d-BLEU (and chrF, chrF++, TER) with sacreBLEU", add_bleu_args, run_bleu),
    "aer": ("precision, recall and AER of word alignments against gold links", add_aer_args, run_aer),
    "align": ("word alignments from a model's cross-attention (force-decoded references), AER per layer",
              add_align_args, run_align),
    "attn-stats": ("sparsity, null rate, head diversity, entropy, top-score ratio per layer and head",
                   add_attn_stats_args, run_attn_stats),
    "memory": ("FFN / key-value memory diagnostics per layer: top-p%% score ratio, anisotropy",
               add_memory_stats_args, run_memory_stats),
    "contrastive": ("contrastive accuracy on ContraPro or DiscEvalMT (force-decoded candidates with context)",
                    add_contrastive_args, run_contrastive),
    "cxmi": ("conditional cross-mutual information: how much a model uses the previous sentences",
             add_cxmi_args, run_cxmi),
    "report": ("(re)build the self-contained index.html of a report folder (demo, study, reference run)",
               add_report_args, run_report),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="reluformer-eval", description=__doc__.split("\n")[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_args, _) in SUBCOMMANDS.items():
        # help is %-formatted by argparse (so it writes %%), a description is printed as it is
        p = sub.add_parser(name, help=help_text, description=help_text.replace("%%", "%"),
                           formatter_class=DefaultsHelpFormatter)
        add_args(p)
        p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
        if name != "report":
            p.add_argument("--html", metavar="PAGE", help="also write a self-contained HTML page of this evaluation "
                                                          "(its tables, plot and JSON report)")
    return parser


class Tee(io.TextIOBase):
    """Standard output that is also kept, for the --html page."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


INPUT_OPTIONS = ("hyp", "ref", "hyp_doc_ids", "ref_doc_ids", "segments", "gold", "pred", "lengths", "src", "tgt",
                 "pairs", "checkpoint")
# the single-file inputs checked for existence up front (bleu checks its hypotheses and references itself)
FILE_OPTIONS = ("hyp_doc_ids", "ref_doc_ids", "segments", "gold", "pred", "lengths", "src", "tgt", "pairs")


def input_files(args) -> List[Tuple[str, str]]:
    """(option, path) of every file the subcommand reads (report: every file of its folder but the
    pages it writes), for :func:`check_distinct_files`."""
    files = []
    for option in INPUT_OPTIONS:
        value = getattr(args, option, None)
        for path in (value if isinstance(value, list) else [value]):
            if path:
                files.append(("--" + option.replace("_", "-"), path))
    if args.command == "report" and Path(args.dir).is_dir():
        files += [("--dir", str(f)) for f in sorted(Path(args.dir).iterdir()) if f.is_file() and f.suffix != ".html"]
    return files


def main(argv: Optional[List[str]] = None) -> int:
    quiet_logging()  # before the subcommand imports fairseq (whose imports would set DEBUG)
    args = build_parser().parse_args(argv)
    run = SUBCOMMANDS[args.command][2]
    try:
        checkpoints = getattr(args, "checkpoint", None)
        for path in checkpoints if isinstance(checkpoints, list) else [checkpoints] if checkpoints else []:
            check_checkpoint_file(path)  # before torch and fairseq load (seconds)
        for option in ("json", "plot", "write_pred", "output", "html"):  # before any work, not after an hour of it
            if getattr(args, option, None):
                check_output_file(getattr(args, option), "--" + option.replace("_", "-"),
                                  creates_folders=option != "write_pred")
        if getattr(args, "device", None):  # auto resolved once, before any model loads
            args.device = resolve_device(args.device)
        if args.command == "bleu":
            check_tokenizer(args.tokenize)
        for option in FILE_OPTIONS:  # every missing file named before any file is read (gold before pred)
            value = getattr(args, option, None)
            for path in value if isinstance(value, list) else [value]:
                check_input_file(path, "--" + option.replace("_", "-"))
        check_distinct_files([("--" + o.replace("_", "-"), getattr(args, o, None))
                              for o in ("json", "plot", "write_pred", "output", "html")], input_files(args))
        if checkpoints:  # subcommands that load models: the entry point registers
            from reluformer_mt.plugin import register

            register()
        command = "reluformer-eval " + " ".join(sys.argv[1:] if argv is None else argv)
        tee = Tee(sys.stdout) if getattr(args, "html", None) else None
        with contextlib.redirect_stdout(tee) if tee else contextlib.nullcontext():
            report = run(args)
        if args.json:
            write_json(args.json, report, command=command)
            print(f"report written to {args.json}", file=sys.stderr)  # stdout holds the results only (-b)
        if getattr(args, "html", None):
            from reluformer_mt.evaluation.html_report import write_evaluation_page

            print(f"HTML page written to {write_evaluation_page(args.html, command, report, tee.kept.getvalue())}",
                  file=sys.stderr)
    except (ValueError, FileNotFoundError) as e:
        print(f"reluformer-eval {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # disk full, an unwritable report or plot
        print(f"reluformer-eval {args.command}: error: {write_error(e)}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
