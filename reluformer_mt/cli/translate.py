"""``reluformer-translate``: translate whole documents with a trained checkpoint.

    reluformer-translate --checkpoint ckpt/checkpoint_best.pt < document.txt > out.txt
    reluformer-translate --checkpoint ckpt/checkpoint_best.pt -i talks.en --format docmt -o talks.de \\
        --beam 4 --scores talks.scores --alignments talks.align

The output keeps the input's layout with exactly one translated sentence per input sentence
(see :mod:`reluformer_mt.inference.inputs` for the formats); a summary (documents, sentences,
segments, fallbacks, time) goes to standard error.

Streaming: a pipe or terminal input (not a regular file) in the lines or docmt format is
translated one document at a time, and each document's output is written and flushed as soon as
it is done, so the command can sit in a pipe as fairseq-interactive does. A regular file is read
whole and its segments batched across documents; the two give the same bytes, as every segment has
its own output length limit, whatever it is batched with.
"""
import argparse
import ast
import logging
import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterator, List

from reluformer_mt.cli.checks import (EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, OneLineParser,
                                     add_spm_model_option,
                                     check_checkpoint_file, check_device, check_distinct_files, check_input_file,
                                     check_input_folder, check_no_repeats, check_output_file, no_gpu_visible,
                                     match_score_names, non_negative_float, non_negative_int, segment_tokens, unit_interval,
                                     writing, write_error)
from reluformer_mt.cli.stored_config import check_resources_findable


def translator_defaults() -> dict:
    """The defaults of ``DocumentTranslator``'s keywords (keyword ``x_y`` is option ``--x-y``): the
    fields of its option groups (:data:`reluformer_mt.inference.options.GROUPS`), read from their
    modules' source, not by importing them: the guidance parts import torch and fairseq (seconds),
    and the options are checked before them, so a bad option is answered at once. The same values
    as :func:`reluformer_mt.inference.options.flat_defaults` (a test compares the two)."""
    from importlib.util import find_spec

    inference = Path(find_spec("reluformer_mt").origin).parent / "inference"
    options = ast.parse((inference / "options.py").read_text(encoding="utf-8"))
    assigned = {t.id: node.value for node in options.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    homes = {alias.name: node.module for node in options.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    groups, plain = ast.literal_eval(_names_as_strings(assigned["GROUPS"])), ast.literal_eval(assigned["PLAIN"])
    out = {"device": "auto"}
    for group, class_name in groups.items():
        module = homes.get(class_name)
        path = inference / "options.py" if module is None else \
            Path(find_spec("reluformer_mt").origin).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
        for field_name, (flat, default) in dataclass_defaults(path, class_name).items():
            out[group if plain.get(group) == field_name else flat] = default
    return out


def _names_as_strings(node):
    """``{"decoding": DecodingOptions}`` -> ``{"decoding": "DecodingOptions"}`` (a literal)."""
    return ast.Dict(keys=node.keys, values=[ast.Constant(v.id) for v in node.values])


def dataclass_defaults(path, class_name: str) -> dict:
    """``{field: (command-line name, default)}`` of the dataclass ``class_name`` in ``path``: a field
    ``x: T = literal`` or ``x: T = field(default=literal, metadata={"flat": name})``."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    cls = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == class_name)
    fields = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None):
            continue
        name, value, flat = node.target.id, node.value, node.target.id
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
            keywords = {k.arg: k.value for k in value.keywords}
            value = keywords["default"]
            if "metadata" in keywords:
                flat = ast.literal_eval(keywords["metadata"]).get("flat", name)
        fields[name] = (flat, ast.literal_eval(value))
    return fields


# beyond this the bonus dwarfs every log-probability a model gives (search copies the memory), and
# near float32's range (1e300 is inf there) beam scores become inf - inf = NaN inside fairseq
MAX_PIECES_WEIGHT = 1e4


def pieces_weight(text) -> float:
    value = non_negative_float(text)
    if value > MAX_PIECES_WEIGHT:
        raise argparse.ArgumentTypeError(f"expected a number in [0, {MAX_PIECES_WEIGHT:g}], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from reluformer_mt.inference.inputs import FORMATS

    D = translator_defaults()

    p = OneLineParser(  # a bad option is one line, as every other error
        prog="reluformer-translate", formatter_class=DefaultsHelpFormatter,
        description="Translate documents with a reluformer checkpoint: documents are cut into segments of the "
                    "trained length, translated with beam search and split back into exactly one sentence per "
                    "input sentence.")
    p.add_argument("--checkpoint", "-c", required=True, nargs="+", metavar="CHECKPOINT",
                   help="fairseq checkpoint (.pt); several: an ensemble (fairseq's EnsembleModel averages their "
                        "probabilities; same dictionaries; the first one's resources)")
    p.add_argument("--input", "-i", default="-", help="input file, '-' = standard input (default)")
    p.add_argument("--output", "-o", default="-", help="output file, '-' = standard output (default)")
    p.add_argument("--format", "-f", choices=FORMATS, default="auto",
                   help="lines: a sentence per line, blank line between documents; docmt: '<d>' starts each document; "
                        "docids: a sentence per line plus --doc-ids; raw: paragraphs split into sentences (pysbd); "
                        "auto (default): docmt if the input starts with <d>, raw only if most lines (at least 3) are "
                        "paragraphs of 3+ sentences and 40+ words, lines otherwise; the summary says which")
    p.add_argument("--doc-ids", help="docids format: file with one document id per input line")
    p.add_argument("--language", help="language of the sentence splitter (pysbd) for raw input (default: the checkpoint's "
                                      "source language; an unknown one is an error listing the known ones)")
    res = p.add_argument_group("resources (default: beside the checkpoint, then the data directory it was trained on)")
    res.add_argument("--data", help="directory prepared by reluformer-prepare (dictionaries, prepared.json, SentencePiece model)")
    add_spm_model_option(res, "the one prepared.json names")
    res.add_argument("--segment-tokens", type=segment_tokens, help="segment length in source tokens, or 'sentence' "
                                                                   "(default: the trained length from prepared.json)")
    gen = p.add_argument_group("search")
    gen.add_argument("--beam", type=int, default=D["beam"], help="beam size (4: the demo's decoding)")
    gen.add_argument("--nbest", type=int, default=D["nbest"], metavar="N",
                     help="write the N best translations of every sentence instead, Moses' n-best format: "
                          "'SENTENCE ||| translation ||| score' (0-based sentence number over the input, mean token "
                          "log-probability in natural log, where fairseq-generate prints base 2), best first; "
                          "N <= --beam")
    gen.add_argument("--lenpen", type=float, default=D["lenpen"], help="length penalty")
    gen.add_argument("--batch-size", type=int, default=D["batch_size"], help="most segments per batch")
    gen.add_argument("--max-tokens", type=int, default=D["max_tokens"], help="most source tokens per batch (padded)")
    gen.add_argument("--max-len-a", type=non_negative_float, default=D["max_len_a"], help="output length limit a * source + b")
    gen.add_argument("--max-len-b", type=non_negative_int, default=D["max_len_b"], help="see --max-len-a")
    gen.add_argument("--separators", choices=("constrained", "free"), default=D["separators"],
                     help="constrained (default): beam search gives each segment's translation exactly the "
                          "source's number of sentence separators (no empty sentence), so it splits back "
                          "without retranslation unless it reaches the length limit; free: plain beam search, "
                          "which shows how often the model keeps the separators by itself (the summary counts "
                          "the fallbacks)")
    gen.add_argument("--device", default=D["device"], help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
    half = gen.add_mutually_exclusive_group()
    half.add_argument("--fp16", action="store_true", help="half precision (float16) on CUDA; an error on the CPU")
    half.add_argument("--bf16", action="store_true", help="bfloat16 on CUDA; an error on the CPU")
    gen.add_argument("--memory-cache", choices=("float16", "float32"), default=D["memory_cache"],
                     help="precision of a memory-attention model's cached memory keys and values in the CPU "
                          "decoding step: float16 (default) reads half the bytes a step (the step's arithmetic "
                          "stays float32; docs/TRANSLATION_MEMORY.md#translation-with-memory-attention), float32 keeps them as computed")
    gen.add_argument("--threads", type=int, help="CPU threads of torch (default: torch's choice); on a busy shared "
                                                 "machine --threads 1 avoids threads spinning against each other")
    tm = p.add_argument_group("translation memory (matches read by checkpoints trained with --tm-fusion concat|attention; "
                              "translation pieces guide any checkpoint)")
    tm.add_argument("--memory", metavar="DIR|FILE.tmx|FILE.tsv",
                    help="the memory to retrieve matches from: a prepared directory (its training split), a TMX file "
                         "(languages from the checkpoint) or a 'source<TAB>target' TSV file "
                         "(default: the training split of the checkpoint's data directory); 'none' translates without "
                         "matches")
    tm.add_argument("--tmx-placeholders", choices=["space", "text"], default=D["tmx_placeholders"],
                    help="a TMX memory's placeholders (<ph>, <ut>): a space where they stood between words, or their "
                         "own text (Value<ph>{0}</ph>here: 'Value here' or 'Value {0} here')")
    tm.add_argument("--match-score", default=D["match_score"], choices=match_score_names()["choices"], metavar="SCORE",
                    help="how the memory ranks its matches (default: the score the checkpoint's data directory was "
                         "prepared with; bm25-chars for a directory prepared without memory, words for one prepared "
                         "before the score was recorded; docs/TRANSLATION_MEMORY.md)")
    tm.add_argument("--tm-first", type=unit_interval, default=D["tm_first"], metavar="T",
                    help="TM-first: a sentence whose best match scores >= T is translated by the match's target, the "
                         "others by the model (with its guidance); 'reluformer-memory tune' tunes T on validation "
                         "(default: off)")
    tm.add_argument("--pieces-weight", type=pieces_weight, default=D["pieces_weight"], metavar="W",
                    help="translation pieces (Zhang et al. NAACL 2018): beam search adds W x the fuzzy score of the best "
                         "match holding each n-gram a next token completes (0: off, the default; the demo's tuned value: "
                         "docs/TRANSLATION_MEMORY.md); works for checkpoints trained without memory too")
    tm.add_argument("--pieces-k", type=int, default=D["pieces_k"], metavar="K", help="matches per sentence whose n-grams are pieces")
    tm.add_argument("--pieces-max-n", type=int, default=D["pieces_max_n"], metavar="N", help="longest piece, in SentencePiece tokens")
    tm.add_argument("--pieces-floor", type=float, default=D["pieces_floor"], metavar="F",
                    help="only matches with a fuzzy score >= F give pieces (the demo's value is tuned with the weight)")
    tm.add_argument("--pieces-length-cap", type=float, default=D["pieces_length_cap"], metavar="F",
                    help="a hypothesis must end the sentence it writes (only the separator or EOS may follow) once it "
                         "is F times the sentence's expected length from its matches: fewer hypotheses follow pieces "
                         "to the length limit (0: off, the default; 'reluformer-memory tune' tunes it)")
    tm.add_argument("--pieces-aligned", action="store_true", default=D["pieces_aligned"],
                    help="pieces only from target words that the memory's word alignment (eflomal, run once per "
                         "memory) links to source words the sentence shares with the match, as Zhang et al. 2018 "
                         "(default: every n-gram of the match)")
    knn = p.add_argument_group("kNN-MT (Khandelwal et al. 2021): the decoder state of every step looks up its nearest "
                               "entries in a datastore and mixes their next tokens into the model's distribution; "
                               "any checkpoint (docs/KNN_MT.md)")
    knn.add_argument("--knn", metavar="DATASTORE", default=D["knn"],
                     help="a datastore built with 'reluformer-memory datastore build' for this checkpoint (its tuned "
                          "values are the defaults of the options below)")
    knn.add_argument("--knn-memory", action="store_true", default=D["knn_memory"],
                     help="per-input datastores (SK-MT, Dai et al. 2023): each sentence's best --knn-memory-k matches "
                          "of the translation memory (--memory), force-decoded at translation time")
    knn.add_argument("--knn-memory-k", type=int, default=D["knn_memory_k"], metavar="M",
                     help="matches per sentence of --knn-memory")
    knn.add_argument("--knn-memory-keys", metavar="DATASTORE", default=D["knn_memory_keys"],
                     help="--knn-memory: read the matches' keys from this datastore (built by the same checkpoint "
                          "from the memory's corpus) instead of force-decoding them: faster (default: force-decoded)")
    knn.add_argument("--knn-batched-search", action="store_true", default=D["knn_batched_search"],
                     help="--knn-memory: search each step's per-input datastores with one batched product per "
                          "sentence (its beams together) instead of per beam row: faster, the same neighbours up "
                          "to float rounding")
    knn.add_argument("--knn-probe", type=int, default=D["knn_probe"], metavar="N",
                     help="--knn: IVF lists searched per step (an HNSW index: efSearch); fewer is faster, recalls "
                          "less (default: as tuned, else the datastore's, 16)")
    knn.add_argument("--knn-search-every", type=int, default=D["knn_search_every"], metavar="N",
                     help="--knn: search the index every N steps; in between each beam row reads the successors "
                          "of its last neighbours that voted for the token it wrote (chunk-based kNN-MT, Martins "
                          "et al. 2022): faster, approximate (default: as tuned, else 1: every step)")
    knn.add_argument("--knn-exact-search", action="store_true", default=D["knn_exact_search"],
                     help="--knn: search the datastore as it was built (every step, the index's own probe) even "
                          "where the tuner chose a faster approximate search")
    knn.add_argument("--knn-restrict", type=int, default=D["knn_restrict"], metavar="M",
                     help="--knn: each sentence searches only the datastore entries of its M best translation memory "
                          "matches (the memory must be the corpus the datastore was built from), exactly, instead "
                          "of the index over the whole corpus: faster (default: as tuned, else 0: the whole datastore)")
    knn.add_argument("--knn-skip-confident", type=float, default=D["knn_skip_confident"], metavar="P",
                     help="a beam row whose model gives its best token a probability above P skips the search and "
                          "keeps the model's distribution (retrieval skipping): faster (default: as tuned, else 1: "
                          "every row searches)")
    knn.add_argument("--knn-k", type=int, default=D["knn_k"], metavar="K", help="neighbours per step (default: tuned, else 16)")
    knn.add_argument("--knn-lambda", type=float, default=D["knn_lambda"], metavar="L",
                     help="largest share of the neighbours (default: tuned, else 0.5)")
    knn.add_argument("--knn-readout", choices=("softmax", "relu", "sparsemax", "entmax15"), default=D["knn_readout"],
                     help="softmax(-d/T) (kNN-MT), relu: ReLU(1 - d/radius) with no mass when every neighbour is "
                          "beyond the radius, sparsemax/entmax15 over -d/T (default: tuned, else softmax)")
    knn.add_argument("--knn-temperature", type=float, default=D["knn_temperature"], metavar="T",
                     help="T of softmax/sparsemax/entmax15 (default: tuned, else 10)")
    knn.add_argument("--knn-radius", type=float, default=D["knn_radius"], metavar="R",
                     help="radius of the relu read-out (default: tuned, else 10)")
    knn.add_argument("--knn-adaptive", action=argparse.BooleanOptionalAction, default=D["knn_adaptive"],
                     help="adaptive kNN-MT (Zheng et al. 2021): the Meta-k network that 'reluformer-memory tune' "
                          "trained beside the --knn datastore picks k and the neighbours' share at every step "
                          "(--knn-k/--knn-lambda then unused; default: as tuned, else off)")
    out = p.add_argument_group("extra outputs (same layout as the output, one sentence per line)")
    out.add_argument("--scores", help="write each sentence's mean token log-probability here (natural log)")
    out.add_argument("--memory-matches", metavar="FILE",
                     help="write each sentence's best memory match here: 'fuzzy score<TAB>entry id<TAB>entry target' "
                          "(what a translator checks first)")
    out.add_argument("--alignments", help="write each sentence's attention alignment here: 'i-j' pairs, 0-based "
                                          "source word i, target word j (words = SentencePiece words)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on standard error (for inputs of 50 segments or more read from a file: a bar "
                        "on a terminal, else a line every 30 s)")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary and warnings on standard error")
    return p


def _side_file(path, option):
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write ({e.strerror})") from None


def check_paths(args) -> None:
    """Every file the run reads or writes is a different file (compared resolved, so './x' and a
    symlink to x are the same), and every output can be written -- before anything is written:
    a --scores equal to --output would overwrite the translation with scores."""
    for option, path in (("--scores", args.scores), ("--alignments", args.alignments),
                         ("--memory-matches", args.memory_matches)):
        if path == "-":
            raise ValueError(f"{option}: give a file; standard output holds the translation")
    if args.memory == "none":  # said before loading: these need the matches that 'none' withholds
        if args.memory_matches:
            raise ValueError("--memory-matches: --memory none withholds the matches; drop one of the two")
        if args.pieces_weight > 0:
            raise ValueError(f"--pieces-weight {args.pieces_weight:g}: translation pieces come from the memory, "
                             "which --memory none withholds; drop one of the two")
        if args.match_score is not None:
            raise ValueError(f"--match-score {args.match_score}: ranks the memory's matches, which --memory none "
                             "withholds; drop one of the two")
    memory_file = args.memory if args.memory and args.memory != "none" and Path(args.memory).is_file() else None
    checkpoints = args.checkpoint if isinstance(args.checkpoint, list) else [args.checkpoint]  # several: an ensemble
    inputs = [("--checkpoint", c) for c in checkpoints] + [("--memory", memory_file), ("--input", args.input),
                                                            ("--doc-ids", args.doc_ids)]
    outputs = [("--output", args.output), ("--scores", args.scores), ("--alignments", args.alignments),
               ("--memory-matches", args.memory_matches)]
    check_no_repeats(inputs, "give each input its own file (an ensemble member given twice would count double)")
    check_distinct_files(outputs, inputs)
    for option, path in outputs:
        if path and path != "-":
            check_output_file(path, option)


def check_options(args) -> None:
    """Option and path checks that need neither the input's text nor the model, and import neither
    torch nor fairseq (so they fail at once)."""
    from reluformer_mt.inference.inputs import check_language

    check_paths(args)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads: expected a positive number, got {args.threads}")
    if args.nbest < 1 or args.nbest > args.beam:
        raise ValueError(f"--nbest {args.nbest}: expected 1 <= N <= --beam ({args.beam})")
    if args.format == "docids" and not args.doc_ids:
        raise ValueError("--format docids needs --doc-ids FILE (one document id per input line)")
    if args.doc_ids and args.format not in ("auto", "docids"):
        raise ValueError(f"--doc-ids goes with --format docids, not {args.format}")
    if args.language:
        check_language(args.language)
    for path in args.checkpoint:  # the loader's own message, before any of them loads
        check_checkpoint_file(path)
    if args.data is None:  # the first checkpoint's resources serve the ensemble
        check_resources_findable(args.checkpoint[0])
    check_input_file(args.input, "--input", "input file")
    check_input_file(args.doc_ids, "--doc-ids")
    if args.memory and args.memory != "none" and not Path(args.memory).exists():
        raise ValueError(f"--memory {args.memory}: no such file or folder")
    check_input_folder(args.data, "--data")
    check_device(args.device)
    if (args.fp16 or args.bf16) and not _cuda_device(args.device):
        raise ValueError(f"--{'fp16' if args.fp16 else 'bf16'}: half precision is for CUDA only "
                         f"(--device {args.device} is the CPU here); translate in full precision on the CPU")


def _cuda_device(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto" or no_gpu_visible():
        return False
    import torch

    return torch.cuda.is_available()


def is_stream(path) -> bool:
    """Standard input or a path that is a pipe or terminal: read as it arrives, not whole."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode if str(path) == "-" else os.stat(path).st_mode
    except (OSError, ValueError, AttributeError):  # pytest's captured stdin has no file number
        return False
    return not stat.S_ISREG(mode)


def _stream_lines(path) -> Iterator[str]:
    """Decoded lines of a stream as they arrive (the rules of ``read_text``: UTF-8, a first BOM
    dropped, CRLF -> LF, a bad byte named by its line)."""
    from reluformer_mt.data.documents import BOM
    from reluformer_mt.data.textfiles import decode_utf8
    from reluformer_mt.inference.inputs import input_name

    name = input_name(path)
    stream = sys.stdin.buffer if str(path) == "-" else open(path, "rb")
    try:
        for number, raw in enumerate(iter(stream.readline, b""), 1):
            try:
                line = decode_utf8(raw, name)
            except ValueError as e:  # decode_utf8 counts lines within this one line
                raise ValueError(str(e).replace(f"{name}:1:", f"{name}:{number}:", 1)) from None
            if number == 1 and line.startswith(BOM):
                line = line[1:]
            yield line[:-1] if line.endswith("\n") else line
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


class Input:
    """The input as chunks of whole documents (``ParsedInput`` each): the whole input at once
    for a file, raw or docids input; one document at a time for a streamed lines/docmt input.
    Constructing it reads and checks the whole file, or a stream's first lines (enough to
    detect its format), so bad input fails before the model loads."""

    def __init__(self, args, language):
        from reluformer_mt.inference.inputs import detect_format_reason, input_name, parse_input, read_text
        from reluformer_mt.data.documents import is_doc_marker

        self.name, self.args, self.language = input_name(args.input), args, language
        self.notes: List[str] = []
        self.fmt, self.detected = args.format, None
        if not is_stream(args.input) or args.format in ("raw", "docids") or args.doc_ids:
            self.lines = None
            self.whole = parse_input(read_text(args.input), self.name, args.format, args.doc_ids, language)
            return
        self.whole, self.lines = None, _stream_lines(args.input)
        self.head: List[str] = []
        if args.format == "auto":  # the rule of detect_format: the first non-blank line, or 100 of them
            for line in self.lines:
                self.head.append(line)
                text = [x for x in self.head if x.strip()]
                if (text and is_doc_marker(text[0])) or len(text) >= 100:
                    break
            self.fmt, self.detected = detect_format_reason(self.head, language)
            if self.fmt == "raw":  # one document unless <d> lines: read it all
                self.whole = parse_input(self.head + list(self.lines), self.name, "raw", None, language)
                self.whole.detected = self.detected
                self.lines = None

    def chunks(self):
        """(ParsedInput of whole documents, whether it is the first chunk)."""
        if self.whole is not None:
            yield self.whole, True
            self.notes = self.whole.notes
            return
        from itertools import chain

        from reluformer_mt.data.documents import is_doc_marker, strip_edges
        from reluformer_mt.inference.inputs import InputDocument, ParsedInput, parse_input

        first, current, marked, invisible, k = True, [], False, 0, 0

        def docmt(lines):
            parsed = parse_input(lines, self.name, "docmt")
            self.notes += [n for n in parsed.notes if not n.endswith("removed at line edges")]  # summed below
            return parsed

        def lines_doc(lines):  # one document of the lines format (parse_lines' rule, document by document)
            return ParsedInput("lines", [InputDocument(f"{self.name}.{k}", [strip_edges(x)[0] for x in lines])])

        for line in chain(self.head, self.lines):
            invisible += strip_edges(line)[1]
            if self.fmt == "docmt":
                if is_doc_marker(line) and marked:
                    yield docmt(current), first
                    first, current = False, []
                marked = marked or is_doc_marker(line)
                current.append(line)
            elif not strip_edges(line)[0]:  # lines: a blank line ends a document (an empty one after another blank)
                yield lines_doc(current), first
                first, current, k = False, [], k + 1
            else:
                current.append(line)
        if self.fmt == "docmt" and (current or first):
            yield docmt(current), first
        elif self.fmt == "lines" and not first or current:  # parse_lines: the text after the last blank line
            yield lines_doc(current), first
        elif self.fmt == "lines":  # no input at all: no documents
            yield ParsedInput("lines", []), True
        if invisible:
            self.notes.append(f"{invisible:,} invisible characters (BOM, zero-width, no-break space) removed at line edges")


def _render_chunk(parsed, texts, first: bool, one_per_line: bool = False) -> List[str]:
    from reluformer_mt.inference.inputs import render

    lines = render(parsed, texts, one_per_line)
    # documents of the lines format are separated by one blank line: before every chunk but the first
    return lines if first or parsed.fmt != "lines" else [""] + lines


def nbest_lines(results, first: int) -> List[str]:
    """``SENTENCE ||| TEXT ||| SCORE`` of every sentence's hypotheses, sentences numbered from ``first``."""
    lines = []
    for sentence, r in enumerate((r for doc in results for r in doc), first):
        for h in [r] + r.alternatives:
            # an empty sentence is not translated: its one (empty) output is certain, log 1 = 0;
            # a TM-first copy is the memory's, not the model's: no score (nan)
            score = "nan" if h.tm_copy else f"{h.score if h.score is not None else 0.0:.4f}"
            lines.append(f"{sentence} ||| {h.text} ||| {score}")
    return lines


def run(args) -> str:
    """Translate as ``args`` say; returns the summary."""
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.inference.inputs import open_output

    start = time.time()
    check_options(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    language = args.language
    if language is None and args.format in ("auto", "raw") and not args.doc_ids:
        from reluformer_mt.checkpoints import open_checkpoint

        language = open_checkpoint(args.checkpoint[0], args.data).data.src_lang  # cheap: no model is built
    source = Input(args, language)  # before the model loads: bad input fails first
    translator = DocumentTranslator(
        args.checkpoint, data=args.data, device=args.device, beam=args.beam, lenpen=args.lenpen,
        batch_size=args.batch_size, max_tokens=args.max_tokens, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
        segment_tokens=args.segment_tokens, spm_model=args.spm_model, separators=args.separators, memory=args.memory,
        pieces_weight=args.pieces_weight, pieces_k=args.pieces_k, pieces_max_n=args.pieces_max_n, nbest=args.nbest,
        fp16=args.fp16, bf16=args.bf16, memory_cache=args.memory_cache, pieces_floor=args.pieces_floor, pieces_aligned=args.pieces_aligned,
        pieces_length_cap=args.pieces_length_cap,
        knn=args.knn, knn_memory=args.knn_memory,
        knn_memory_k=args.knn_memory_k, knn_batched_search=args.knn_batched_search, knn_probe=args.knn_probe, knn_search_every=args.knn_search_every,
        knn_exact_search=args.knn_exact_search, knn_restrict=args.knn_restrict, knn_memory_keys=args.knn_memory_keys,
        knn_skip_confident=args.knn_skip_confident, knn_k=args.knn_k, knn_lambda=args.knn_lambda, knn_readout=args.knn_readout,
        knn_temperature=args.knn_temperature, knn_radius=args.knn_radius, knn_adaptive=args.knn_adaptive,
        tmx_placeholders=args.tmx_placeholders, match_score=args.match_score, tm_first=args.tm_first)
    if args.memory_matches and translator.memory is None:
        raise ValueError(f"--memory-matches: {args.checkpoint[0]} was trained without a translation memory (--tm-fusion none); "
                         "with --pieces-weight W > 0 it consults one")
    if not args.quiet:
        print(f"reluformer-translate: {translator.describe()}", file=sys.stderr, flush=True)

    def match_line(r):
        if r.match is None:
            return ""
        entry, score = r.match
        return f"{score:.3f}\t{entry}\t{translator.memory.target(entry)}"

    sides = [(option, path, fn) for option, path, fn in (
        ("--scores", args.scores, lambda r: "nan" if r.tm_copy else "" if r.score is None else f"{r.score:.4f}"),
        ("--alignments", args.alignments, lambda r: " ".join(f"{i}-{j}" for i, j in (r.alignment or []))),
        ("--memory-matches", args.memory_matches, match_line)) if path]
    stream = open_output(args.output)
    files = [(option, path, _side_file(path, option), fn) for option, path, fn in sides]
    sentence, last = 0, None
    try:
        for parsed, first in source.chunks():
            last = parsed
            results = translator.translate([d.sentences for d in parsed.documents], scores=bool(args.scores),
                                           alignments=bool(args.alignments),
                                           progress=False if args.no_progress or not first or source.whole is None
                                           else None)
            with writing("standard output" if stream is sys.stdout else args.output):
                if args.nbest > 1:
                    lines = nbest_lines(results, sentence)
                    sentence += sum(len(doc) for doc in results)
                else:
                    lines = _render_chunk(parsed, [[r.text for r in doc] for doc in results], first)
                stream.write("".join(line + "\n" for line in lines))
                stream.flush()  # each document leaves as soon as it is done (a pipe's reader waits for it)
            for option, path, f, fn in files:
                with writing(path):
                    f.write("".join(line + "\n" for line in _render_chunk(
                        parsed, [[fn(r) for r in doc] for doc in results], first, one_per_line=True)))
                    f.flush()
    finally:
        # a close flushes: a full disk can fail there too, and must name its own file (a failed
        # write leaves its bytes in the buffer, so the close fails again, naming the same file)
        if stream is not sys.stdout:
            with writing(args.output):
                stream.close()
        for _, path, f, _ in files:
            with writing(path):
                f.close()
    summary = "\n".join([translator.summary()] + [f"  {line}" for line in translator.kernels_used()])
    fmt = (last.fmt if last is not None else source.fmt)
    detected = source.detected or (last.detected if last is not None else None)
    fmt += f" (detected: {detected}; --format chooses)" if detected else ""
    notes = "".join(f"\n  {note}" for note in source.notes)
    return f"{summary}\n  input format: {fmt}; total time with loading: {time.time() - start:.1f} s{notes}"


def main(argv=None) -> int:
    # force: importing fairseq (text_to_speech) already configured the root logger at INFO
    logging.basicConfig(format="reluformer-translate: %(levelname)s: %(message)s", level=logging.WARNING,
                        stream=sys.stderr, force=True)
    args = build_parser().parse_args(argv)
    if args.quiet:
        logging.getLogger().setLevel(logging.ERROR)
    try:  # before torch and fairseq load (seconds): a bad option or path is answered at once
        check_options(args)
    except ValueError as e:
        print(f"reluformer-translate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from reluformer_mt.checkpoints import CheckpointError
    from reluformer_mt.inference.translator import TranslationError
    from reluformer_mt.plugin import register

    register()  # the entry point registers the plugin; the checkpoint loader only loads
    try:
        summary = run(args)
    except (TranslationError, ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"reluformer-translate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a write outside the guarded ones (e.g. a full disk under a cache)
        print(f"reluformer-translate: error: {write_error(e, args.output)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("reluformer-translate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.quiet:
        print(f"reluformer-translate: {summary}", file=sys.stderr, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
