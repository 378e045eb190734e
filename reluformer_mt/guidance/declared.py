"""Every option of decoding declared once: a field of a group's frozen dataclass, with its help,
its check (the dataclass's ``__post_init__``) and the names it has on each surface. Imports
neither torch nor fairseq, so reluformer-translate builds its command line and checks its options
from these declarations before anything heavy loads.

A group is registered with :func:`register_group` (the translator's own: search, precision,
memory...) or, for a kind of decoding guidance, :func:`register_guidance`. From the registered
groups come reluformer-translate's arguments (:mod:`reluformer_mt.cli.translate`), the
``DocumentTranslator`` keywords (:mod:`reluformer_mt.inference.options`), the fairseq task's
generation fields (:mod:`reluformer_mt.tasks.document_translation`) and ``--guidance``
specs (:func:`parse_guidance`).

A field's names: its keyword (``flat`` metadata, else ``PREFIX_FIELD`` with the group's prefix, else
the field's name) is the command line's ``--key-word``; ``task`` metadata (True or a name) makes it
a field of the task's config too. The defaults of a guidance kind ask for nothing (its part is not
built), so every registered kind is always assembled.
"""
import dataclasses
import importlib
import typing
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Union


class TranslationError(ValueError):
    """A one-line, user-facing problem (bad checkpoint, missing resources, bad option)."""


# the command line's sections that several groups share (a group registered without one gets its
# own, titled by its docstring)
SECTIONS = {
    "resources": "resources (default: beside the checkpoint, then the data directory it was trained on)",
    "search": "search",
    "memory": "translation memory (matches read by checkpoints trained with --tm-fusion concat|attention; "
              "translation pieces guide any checkpoint)",
}


def option(default, help: str, *, flat: Optional[str] = None, metavar: Optional[str] = None, choices=None,
           parse: Optional[Callable[[str], object]] = None, task: Union[bool, str] = False):
    """A dataclass field declaring one option: ``parse`` reads the command line's text (default: the
    field's type), ``choices`` limits it, ``task`` also makes it a field of fairseq's task config
    (True: under its keyword, a string: under that name)."""
    metadata = {"help": help, "flat": flat, "metavar": metavar, "choices": choices, "parse": parse, "task": task}
    return dataclasses.field(default=default, metadata={k: v for k, v in metadata.items() if v not in (None, False)})


@dataclass(frozen=True)
class Group:
    """A registered group of options: ``name`` is its keyword in ``DocumentTranslator(name=...)``
    (an options object, or the plain value of its field of that keyword: ``knn="DIR"``), ``title``
    its heading in ``--help``; ``build``: a guidance kind's part builder (``build(options, context)``,
    or ``"module:function"``, imported when first built)."""
    name: str
    options: type
    title: str = ""
    prefix: str = ""
    build: Union[None, str, Callable] = None

    @property
    def guidance(self) -> bool:
        return self.build is not None

    def flat_names(self) -> Dict[str, str]:
        """Keyword -> field name."""
        return {keyword(self, f): f.name for f in dataclasses.fields(self.options)}

    def builder(self) -> Callable:
        if isinstance(self.build, str):
            module, _, function = self.build.partition(":")
            return getattr(importlib.import_module(module), function)
        return self.build


_GROUPS: Dict[str, Group] = {}


def register_group(name: str, options: type, section: str = "", prefix: str = "",
                   build: Union[None, str, Callable] = None) -> Group:
    """Declare ``options`` (a frozen dataclass of :func:`option` fields) a group of the translator's
    options, in the command line's ``section`` (a key of :data:`SECTIONS`; none: its own, titled by
    the class's docstring); registering a name again replaces the group (a module reloaded)."""
    title = SECTIONS[section] if section else " ".join((options.__doc__ or name).split())
    group = _GROUPS[name] = Group(name, options, title, prefix, build)
    return group


def register_guidance(name: str, options: type, build: Union[str, Callable], section: str = "") -> Group:
    """Make ``options`` a kind of decoding guidance: :func:`reluformer_mt.guidance.build_guidance`
    builds its part with ``build(options, context)``; its fields are options of reluformer-translate
    (``--NAME-FIELD``), keywords of ``DocumentTranslator`` (``NAME_FIELD``) and, in fairseq-generate,
    ``--guidance NAME:FIELD=VALUE``."""
    return register_group(name, options, section, name, build)


def groups() -> List[Group]:
    """Every registered group, in registration order."""
    return list(_GROUPS.values())


def group_of(options) -> Group:
    for group in _GROUPS.values():
        if type(options) is group.options:
            return group
    raise TranslationError(f"guidance: {type(options).__name__} is no registered kind of guidance (register_guidance)")


def kind_named(name: str) -> Group:
    kinds = [g for g in _GROUPS.values() if g.guidance]
    for kind in kinds:
        if kind.name == name:
            return kind
    raise TranslationError(f"--guidance: no kind of guidance {name!r}; known: {', '.join(k.name for k in kinds)}")


def keyword(group: Group, f: dataclasses.Field) -> str:
    """A field's keyword (= its command-line name with dashes)."""
    if f.metadata.get("flat"):
        return f.metadata["flat"]
    return f"{group.prefix}_{f.name}" if group.prefix else f.name


def flag(options: type, name: str) -> str:
    """The command-line option of field ``name`` of a registered options class: ``--knn-lambda``."""
    group = next(g for g in _GROUPS.values() if g.options is options)
    f = next(f for f in dataclasses.fields(options) if f.name == name)
    return "--" + keyword(group, f).replace("_", "-")


def task_name(group: Group, f: dataclasses.Field) -> Optional[str]:
    """The field's name in the fairseq task's config, None if it has none."""
    task = f.metadata.get("task")
    return None if not task else task if isinstance(task, str) else keyword(group, f)


def value_type(f: dataclasses.Field) -> type:
    """The type a field's text is read as: ``Optional[int]`` -> int."""
    args = [a for a in typing.get_args(f.type) if a is not type(None)]
    return args[0] if typing.get_origin(f.type) is Union and len(args) == 1 else f.type


def read_value(group: Group, f: dataclasses.Field, text: str):
    """A field's value from text (the command line, a ``--guidance`` spec): one line naming the
    option when it cannot be read."""
    if "parse" in f.metadata:
        try:
            return f.metadata["parse"](text)
        except ValueError as e:
            raise TranslationError(f"--{keyword(group, f).replace('_', '-')}: {e}") from None
    cast = value_type(f)
    if cast is bool:
        return str(text).lower() in ("1", "true", "yes", "")
    try:
        return cast(text)
    except (TypeError, ValueError):
        raise TranslationError(f"--{keyword(group, f).replace('_', '-')}: expected a {cast.__name__}, "
                               f"got {text!r}") from None


def number(cast: type, low, high=None, what: str = "a number"):
    """A ``parse`` for numbers in [low, high]: the message says the range and echoes the text."""
    span = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"

    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not (low <= value <= (float("inf") if high is None else high)) or value != value:
            raise ValueError(f"expected {what} {span}, got {text!r}")
        return value
    return parse


def parse_guidance(spec: Optional[str]) -> list:
    """Options from ``NAME:field=value,...;NAME2:...`` (fairseq's ``--guidance``)."""
    out = []
    for item in filter(None, (s.strip() for s in (spec or "").split(";"))):
        name, _, args = item.partition(":")
        kind = kind_named(name.strip())
        values = dict(a.split("=", 1) if "=" in a else (a, "") for a in filter(None, args.split(",")))
        fields = {f.name: f for f in dataclasses.fields(kind.options)}
        unknown = [k.strip() for k in values if k.strip() not in fields]
        if unknown:
            raise TranslationError(f"--guidance {kind.name}: no option {unknown[0]!r}; expected one of {', '.join(fields)}")
        out.append(kind.options(**{k.strip(): read_value(kind, fields[k.strip()], v.strip()) for k, v in values.items()}))
    return out
