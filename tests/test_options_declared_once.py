"""Every option of the translator is declared once -- a field of its group's frozen dataclass, with
its default, help and check (reluformer_mt.inference.options, the guidance kinds' options modules,
the tuner's record in reluformer_mt.knn.values) -- and reluformer-translate's command line, the
Python API's keywords, the fairseq task's generation fields and the tuner's record are derived
from it. The test walks the declarations and each surface, then reads the surfaces' source for a
second definition of a name or a default."""
import ast
import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "reluformer_mt"
# the modules of the four surfaces and of the parts that read the options
SURFACES = [PACKAGE / "cli" / "translate.py", *sorted((PACKAGE / "inference").rglob("*.py")),
            *sorted((PACKAGE / "tasks").rglob("*.py")), *sorted((PACKAGE / "knn").rglob("*.py"))]


def declared():
    """keyword -> (group, field) of every registered group; each keyword once."""
    from reluformer_mt.guidance.declared import keyword
    from reluformer_mt.inference.options import groups

    out = {}
    for group in groups():
        for f in dataclasses.fields(group.options):
            name = keyword(group, f)
            assert name not in out, f"{name} is declared by {out[name][0].name} and {group.name}"
            out[name] = (group, f)
    return out


def test_the_groups_are_small_frozen_dataclasses_of_the_parts_that_own_them():
    from reluformer_mt.inference.options import groups

    names = [g.name for g in groups()]
    assert {"knn", "pieces", "memory", "tm_first", "search", "precision", "separators", "resources"} <= set(names)
    for group in groups():
        assert group.options.__dataclass_params__.frozen, group.name
        assert len(dataclasses.fields(group.options)) <= 16, group.name
        for f in dataclasses.fields(group.options):
            assert f.metadata.get("help"), f"{group.name}.{f.name} has no help"


def test_the_command_line_is_derived_from_the_declarations():
    from reluformer_mt.cli.translate import build_parser

    actions = {}
    for action in build_parser()._actions:
        actions.setdefault(action.dest, []).append(action)
    for name, (group, f) in declared().items():
        flag = "--" + name.replace("_", "-")
        assert len(actions.get(name, [])) == 1, f"{flag}: {len(actions.get(name, []))} arguments"
        action = actions[name][0]
        assert flag in action.option_strings and action.default == f.default, flag
        assert f.metadata["help"] in action.help  # the declaration's help, not a second one
        if "choices" in f.metadata:
            assert tuple(action.choices) == tuple(f.metadata["choices"]), flag


def test_the_python_api_takes_each_declared_keyword_and_nothing_else():
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.inference.options import TranslatorOptions, flat_defaults

    names = declared()
    defaults = {name: f.default for name, (_, f) in names.items()}
    assert flat_defaults() == defaults
    assert TranslatorOptions.of(**defaults).keywords() == defaults
    given = {"beam": 5, "knn": "ds", "knn_lambda": 0.25}
    assert TranslatorOptions.of(**given).keywords() == {**defaults, **given}
    # the constructor lists none of them (they come through **options, checked by their groups)
    assert not set(inspect.signature(DocumentTranslator.__init__).parameters) & set(names)
    with pytest.raises(TypeError, match="unexpected keyword argument 'knn_lamda'"):
        TranslatorOptions.of(knn_lamda=0.3)


def test_the_task_fields_and_the_tuners_record_are_derived_from_the_declarations():
    from reluformer_mt.guidance.declared import task_name
    from reluformer_mt.guidance.knn_options import KnnMtOptions
    from reluformer_mt.knn.values import KnnOptions
    from reluformer_mt.tasks.document_translation import DocumentTranslationConfig

    config = {f.name: f for f in dataclasses.fields(DocumentTranslationConfig)}
    marked = {task_name(g, f): f for g, f in declared().values() if task_name(g, f)}
    assert {"knn_datastore", "knn_k", "knn_lambda", "knn_readout", "knn_adaptive"} <= set(marked)
    for name, f in marked.items():
        assert name in config and config[name].default == f.default and f.metadata["help"] in config[name].metadata["help"]
    # no other task field spells an option's keyword (a second definition)
    assert not {n for n in config if n in declared() and n not in marked}
    # the record's values are the kNN-MT options' search values (None there: as tuned)
    given = {f.name: f for f in dataclasses.fields(KnnMtOptions)}
    record = KnnOptions(k=8, lam=0.25)
    assert set(record.translator_options()) <= set(declared())
    for f in dataclasses.fields(KnnOptions):
        assert given[f.name].default is None and given[f.name].metadata["flat"] == f.metadata["flat"]
    options = KnnMtOptions(datastore="ds", **{k: v for k, v in record.as_dict().items()})
    assert options.given() == record.as_dict()


def _definitions(path: Path, flags: set, keywords: set, classes: set):
    """Where ``path`` defines an option again: an argument of a declared flag, a dataclass field or
    a dict entry spelling a declared keyword or flag, a call giving a group's fields one by one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            strings = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            if name == "add_argument" and strings & flags:
                found.append(f"add_argument({sorted(strings & flags)[0]})")
            if name in classes and len([k for k in node.keywords if k.arg]) >= 2:
                found.append(f"{name}(...) field by field")
            if len([k for k in node.keywords if k.arg in keywords]) >= 3:
                found.append(f"{name}({', '.join(k.arg for k in node.keywords if k.arg in keywords)[:60]}...)")
        elif isinstance(node, ast.ClassDef) and node.name not in classes:  # a field with a second default
            found += [f"{node.name}.{a.target.id}" for a in node.body if isinstance(a, ast.AnnAssign)
                      and isinstance(a.target, ast.Name) and a.target.id in keywords and a.value is not None]
        elif isinstance(node, ast.Dict):
            found += [f"{{...: {v.value!r}}}" for v in node.values
                      if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in flags]
    return [f"{path.relative_to(REPO)}: {what}" for what in found]


def test_no_surface_defines_an_option_a_second_time():
    from reluformer_mt.guidance.declared import task_name
    from reluformer_mt.inference.options import groups

    names = declared()
    flags = {"--" + n.replace("_", "-") for n in names}
    keywords = set(names) | {task_name(g, f) for g, f in names.values() if task_name(g, f)}
    # the declaring dataclasses (and the ones they are made from)
    classes = {c.__name__ for g in groups() for c in g.options.__mro__ if dataclasses.is_dataclass(c)} | {"KnnOptions"}
    again = [line for path in SURFACES for line in _definitions(path, flags, keywords, classes)]
    assert not again, again


def test_the_check_finds_a_second_definition():
    """The source check above reads what the surfaces looked like before: it must find them."""
    import tempfile

    old = ('import argparse\n'
           'def build_parser(p):\n    p.add_argument("--knn-lambda", type=float, default=None)\n'
           'class Config:\n    knn_k: int = 16\n'
           'NAMES = {"lam": "--knn-lambda"}\n'
           'def options(cfg):\n    return KnnMtOptions(datastore=cfg.knn_datastore, k=cfg.knn_k)\n'
           'def run(args):\n    return T(beam=args.beam, lenpen=args.lenpen, knn=args.knn)\n')
    with tempfile.TemporaryDirectory(dir=REPO) as folder:
        path = Path(folder) / "old.py"
        path.write_text(old, encoding="utf-8")
        found = _definitions(path, {"--knn-lambda"}, {"knn_k", "beam", "lenpen", "knn"}, {"KnnMtOptions"})
    assert len(found) == 5, found


PROBE = """
import json, sys
from reluformer_mt.cli.translate import build_parser, translator_options
args = build_parser().parse_args(sys.argv[1:])
options = translator_options(args)
print(json.dumps({"loaded": sorted(m for m in ("torch", "fairseq", "numpy") if m in sys.modules),
                  "beam": options.search.beam, "lam": options.knn.lam, "weight": options.pieces.weight}))
"""


def test_the_command_line_parses_and_checks_its_options_without_torch():
    argv = ["-c", "x.pt", "--beam", "5", "--knn", "ds", "--knn-lambda", "0.25", "--pieces-weight", "2",
            "--tm-first", "0.9", "--match-score", "words", "--segment-tokens", "sentence", "--knn-adaptive"]
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"loaded": [], "beam": 5, "lam": 0.25, "weight": 2.0}


def test_no_module_of_the_package_reads_the_package_source_as_a_syntax_tree():
    readers = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
               if any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(a.name == "ast" for a in n.names)
                      for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))]
    assert not readers, readers


@pytest.mark.parametrize("argv, says", [
    (["--knn-k", "many"], "argument --knn-k: expected an int, got 'many'"),
    (["--pieces-weight", "1e300"], "argument --pieces-weight: expected a number in [0, 10000], got '1e300'"),
    (["--tm-first", "2"], "argument --tm-first: expected a number in [0, 1], got '2'"),
    (["--knn-readout", "max"], "argument --knn-readout: invalid choice: 'max'"),
])
def test_a_bad_option_is_one_line_naming_it(argv, says, capsys):
    from reluformer_mt.cli.translate import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["-c", "x.pt", *argv])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("keywords, says", [
    ({"knn_k": 4}, "--knn-k/--knn-lambda/--knn-temperature/--knn-radius/--knn-readout/--knn-adaptive need --knn"),
    ({"pieces_weight": 1.0, "memory": "none"}, "--pieces-weight 1: translation pieces come from the memory, which "
                                                 "--memory none withholds"),
    ({"nbest": 5}, "--nbest 5: expected 1 <= N <= --beam (4)"),
    ({"fp16": True, "bf16": True}, "--fp16 and --bf16: give one of them"),
])
def test_the_groups_check_their_options_and_where_they_meet(keywords, says):
    from reluformer_mt.guidance.declared import TranslationError
    from reluformer_mt.inference.options import TranslatorOptions

    with pytest.raises(TranslationError) as error:
        TranslatorOptions.of(**keywords)
    assert says in str(error.value) and "\n" not in str(error.value)
