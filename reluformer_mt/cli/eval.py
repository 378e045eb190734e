"""``reluformer-eval``: evaluation subcommands (METHODS.md section 4).

    reluformer-eval bleu --hyp gen.out --segments data-bin/test.segments.tsv --ref test.de ...
    reluformer-eval aer  --gold enfr.gold --gold-base 1 --pred pred.txt --lengths enfr.src-tgt

Every subcommand prints a readable table and, with ``--json PATH``, writes a JSON report. A new
subcommand is a pair (add_arguments, run) registered in ``SUBCOMMANDS``; ``run(args)`` returns
the report dict (so it is callable from Python) and prints its table.
"""
import argparse
import sys
from typing import Callable, Dict, List, Optional, Tuple

from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation import bleu as bleu_lib
from reluformer_mt.evaluation.reports import format_table, write_json

LEVELS = {"s": "sentence", "d": "document", "seg": "segment"}


# ---------------------------------------------------------------------------------------------- bleu

def add_bleu_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hyp", required=True, help="hypotheses: fairseq-generate output, a <d>-format file, or one sentence a line")
    p.add_argument("--hyp-format", default="auto", choices=["auto", "generate", "d", "plain"],
                   help="auto: <d> on the first line = d; S-/H- lines = generate; else plain")
    p.add_argument("--hyp-doc-ids", help="doc id per line of a plain --hyp")
    p.add_argument("--ref", help="reference: a <d>-format file or one sentence a line (raw, untokenised)")
    p.add_argument("--ref-format", default="auto", choices=["auto", "d", "plain"])
    p.add_argument("--ref-doc-ids", help="doc id per line of a plain --ref")
    p.add_argument("--ref-from-generate", action="store_true",
                   help="use the T- lines of --hyp as reference (binarised targets: may hold <unk>)")
    p.add_argument("--segments", help="{split}.segments.tsv of the generated split (sample id order)")
    p.add_argument("--separator", default=bleu_lib.SEPARATOR, help="sentence separator token inside segments")
    p.add_argument("--pieces", default="auto", choices=["auto", "yes", "no"],
                   help="generate output holds SentencePiece pieces (yes), text from --post-process sentencepiece "
                        "(no), or detect by '▁' (auto)")
    p.add_argument("--levels", default="s,d", help="comma list of s (s-BLEU), d (d-BLEU over documents), seg (d-BLEU over segments)")
    p.add_argument("--match-docs-by", default="id", choices=["id", "order"],
                   help="pair hypothesis and reference documents by id or by position (<d> files number documents 0, 1, ...)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="documents whose sentence counts differ are reported, not an error; then only d-BLEU is scored")
    p.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer")
    p.add_argument("--lowercase", action="store_true")


def run_bleu(args) -> dict:
    levels = []
    for lv in args.levels.split(","):
        if lv.strip() not in LEVELS:
            raise ValueError(f"--levels: unknown level {lv!r}, expected a comma list of s, d, seg")
        levels.append(LEVELS[lv.strip()])
    report = bleu_lib.bleu_from_files(
        args.hyp, args.ref, hyp_format=args.hyp_format, ref_format=args.ref_format, hyp_doc_ids=args.hyp_doc_ids,
        ref_doc_ids=args.ref_doc_ids, segments=args.segments, separator=args.separator, pieces=args.pieces,
        ref_from_generate=args.ref_from_generate, levels=levels, match=args.match_docs_by,
        allow_mismatch=args.allow_mismatch, tokenize=args.tokenize, lowercase=args.lowercase)
    print(report["definition"])
    rows = [(r.name, r.score, r.n_items, r.verbose) for r in report["scores"].values()]
    print(format_table(["metric", "BLEU", "items", "details"], rows))
    for r in report["scores"].values():
        print(f"{r.name} signature: BLEU|{r.signature}")
    if report["mismatches"]:
        print(f"\n{len(report['mismatches'])} documents differ in sentence count:")
        print(format_table(["doc id", "hyp sentences", "ref sentences"],
                           [(m["doc_id"], m["hyp_sentences"], m["ref_sentences"]) for m in report["mismatches"]]))
    for note in report["notes"]:
        print(f"note: {note}")
    return report


# ---------------------------------------------------------------------------------------------- aer

def add_aer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gold", required=True, help="gold links, one sentence a line ('i-j' sure, 'ipj' possible)")
    p.add_argument("--gold-base", type=int, default=1, choices=[0, 1],
                   help="index base of the gold file (awesome-align sets: 1; Biçici de-en.wa: 0)")
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
    if lengths is not None:
        if not args.unchecked_gold:
            aer_lib.check_ranges([p for _, p in gold], lengths, args.gold, args.gold_base)
        if args.pred:
            aer_lib.check_ranges(pred, lengths, args.pred, args.pred_base)
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


# ---------------------------------------------------------------------------------------------- main

SUBCOMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "bleu": ("s-BLEU and d-BLEU with sacreBLEU", add_bleu_args, run_bleu),
    "aer": ("precision, recall and AER of word alignments against gold links", add_aer_args, run_aer),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reluformer-eval", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_args, _) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    run = SUBCOMMANDS[args.command][2]
    try:
        report = run(args)
        if args.json:
            write_json(args.json, report, command="reluformer-eval " + " ".join(sys.argv[1:] if argv is None else argv))
            print(f"report written to {args.json}")
    except (ValueError, FileNotFoundError) as e:
        print(f"reluformer-eval {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
