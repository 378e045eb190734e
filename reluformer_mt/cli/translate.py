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
import dataclasses
import logging
import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterator, List

from reluformer_mt.cli.checks import (EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, OneLineParser,
                                     add_spm_model_option, check_checkpoint_file, check_device, check_distinct_files,
                                     check_input_file, check_input_folder, check_no_repeats, check_output_file,
                                     no_gpu_visible, writing, write_error)
from reluformer_mt.cli.stored_config import check_resources_findable
from reluformer_mt.guidance.declared import SECTIONS


def add_translator_options(parser) -> dict:
    """Every option of the translator's registered groups (:mod:`reluformer_mt.inference.options`,
    the guidance kinds), derived from their declarations, in sections by the groups' titles (the
    translator's own groups first). Returns the argument groups by title."""
    from reluformer_mt.inference.options import groups

    ordered = [g for g in groups() if not g.guidance] + [g for g in groups() if g.guidance]
    sections = {}
    for group in ordered:
        if group.title not in sections:
            sections[group.title] = parser.add_argument_group(group.title)
        for f in dataclasses.fields(group.options):
            _add_option(sections[group.title], group, f)
    return sections


def _add_option(section, group, f) -> None:
    """One declared field as an argument: ``--keyword`` with its default, help, choices and metavar; a
    flag for a boolean (``--no-x`` too where its default is unset)."""
    from reluformer_mt.guidance.declared import keyword, value_type

    name = keyword(group, f)
    if name == "spm_model":  # every command's one --spm-model syntax
        add_spm_model_option(section, f.metadata["help"])
        return
    extra = {k: f.metadata[k] for k in ("metavar", "choices") if k in f.metadata}
    if value_type(f) is bool:
        extra["action"] = "store_true" if f.default is False else argparse.BooleanOptionalAction
    else:
        extra["type"] = _argument_type(group, f)
    section.add_argument("--" + name.replace("_", "-"), dest=name, default=f.default, help=f.metadata.get("help"),
                         **extra)


def _argument_type(group, f):
    """Reads a declared field's text as its declaration says (its ``parse``, else its type)."""
    from reluformer_mt.guidance.declared import value_type

    parse, cast = f.metadata.get("parse"), value_type(f)

    def read(text):
        try:
            return parse(text) if parse else cast(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e) if parse else f"expected {'an' if cast is int else 'a'} "
                                             f"{cast.__name__}, got {text!r}") from None
    read.__name__ = getattr(cast, "__name__", "value")
    return read


def translator_options(args):
    """The translator's options from the parsed arguments (checked, in one line each)."""
    from reluformer_mt.inference.options import TranslatorOptions, flat_defaults

    return TranslatorOptions.of(**{name: getattr(args, name) for name in flat_defaults()})


def build_parser() -> argparse.ArgumentParser:
    from reluformer_mt.inference.inputs import FORMATS

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
    sections = add_translator_options(p)
    sections[SECTIONS["resources"]].add_argument("--data", help="directory prepared by reluformer-prepare (dictionaries, "
                                                      "prepared.json, SentencePiece model)")
    sections[SECTIONS["search"]].add_argument("--threads", type=int, help="CPU threads of torch (default: torch's choice); on a "
                                                               "busy shared machine --threads 1 avoids threads "
                                                               "spinning against each other")
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
    if args.memory == "none" and args.memory_matches:  # said before loading: 'none' withholds the matches
        raise ValueError("--memory-matches: --memory none withholds the matches; drop one of the two")
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
    translator_options(args)  # each group's checks and those where groups meet (TranslationError: a ValueError)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads: expected a positive number, got {args.threads}")
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


def _open_translator(args):
    """The input (read and checked first: bad input fails before the model loads) and the translator."""
    from reluformer_mt.inference import DocumentTranslator

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    language = args.language
    if language is None and args.format in ("auto", "raw") and not args.doc_ids:
        from reluformer_mt.checkpoints import open_checkpoint

        language = open_checkpoint(args.checkpoint[0], args.data).data.src_lang  # cheap: no model is built
    source = Input(args, language)
    translator = DocumentTranslator(args.checkpoint, data=args.data, **translator_options(args).groups)
    if args.memory_matches and translator.memory is None:
        raise ValueError(f"--memory-matches: {args.checkpoint[0]} was trained without a translation memory (--tm-fusion none); "
                         "with --pieces-weight W > 0 it consults one")
    if not args.quiet:
        print(f"reluformer-translate: {translator.describe()}", file=sys.stderr, flush=True)
    return source, translator


def _side_outputs(args, translator) -> list:
    """(option, path, how a result reads) of each extra output asked for."""
    def match_line(r):
        if r.match is None:
            return ""
        entry, score = r.match
        return f"{score:.3f}\t{entry}\t{translator.memory.target(entry)}"

    return [(option, path, fn) for option, path, fn in (
        ("--scores", args.scores, lambda r: "nan" if r.tm_copy else "" if r.score is None else f"{r.score:.4f}"),
        ("--alignments", args.alignments, lambda r: " ".join(f"{i}-{j}" for i, j in (r.alignment or []))),
        ("--memory-matches", args.memory_matches, match_line)) if path]


def _translate_chunks(args, source, translator, stream, files):
    """Translate the input chunk by chunk, each chunk's lines written and flushed as it is done;
    returns the last chunk (its format for the summary)."""
    sentence, last = 0, None
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
    return last


def run(args) -> str:
    """Translate as ``args`` say; returns the summary."""
    from reluformer_mt.inference.inputs import open_output

    start = time.time()
    check_options(args)
    source, translator = _open_translator(args)
    stream = open_output(args.output)
    files = [(option, path, _side_file(path, option), fn) for option, path, fn in _side_outputs(args, translator)]
    try:
        last = _translate_chunks(args, source, translator, stream, files)
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
