"""Command-line options as dataclasses: a field made with :func:`option` is also an option of the
command; :meth:`Options.add_to` generates the argparse parser from the fields (the pattern of
fairseq's ``gen_parser_from_dataclass``, with the types, metavars and appending options the
project's commands need), :meth:`Options.from_namespace` reads the parsed command line back as the
dataclass and :func:`to_argv` writes options back as a command line. Python callers build the
dataclass directly. Used by the grid's commands (``experiments/options.py``) and the Fig. 3
analysis (``analysis/init_grad.py``).

The argparse pieces every command shares: :class:`CommandParser` (errors as one line, exit 2), the
option types (:func:`whole_number`, :func:`finite_float`, :func:`fraction`, :func:`comma_list_type`),
the numbers an option takes (:class:`Range`, :func:`at_least`) and the one reader of comma-separated
values (:func:`comma_list`)."""
import argparse
import math
import sys
from dataclasses import MISSING, dataclass, field, fields

from .errors import USAGE_EXIT, LnposError, check


def option(default=None, help=None, *, flag=None, positional=False, **argparse_kw):
    """A dataclass field that is a command-line option: ``--NAME`` (``flag`` to name it otherwise, a
    tuple for several names, the first written back by :func:`to_argv`; ``positional`` for an argument), ``help``, and any other keyword of ``add_argument`` (type,
    choices, metavar, required, action; a bool field is a switch: store_true, or store_false when
    its default is true)."""
    return field(default=default, metadata=dict(argparse_kw, help=help, flag=flag, positional=positional))


def _flags(f):
    if f.metadata["positional"]:
        return [f.name]
    flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
    return [flag] if isinstance(flag, str) else list(flag)


def _flag(f):
    return _flags(f)[0]


def _action(f):
    if "action" in f.metadata:
        return f.metadata["action"]
    return ("store_false" if f.default else "store_true") if f.type is bool else "store"


class Options:
    """A command's options; its fields made with :func:`option` are its command line."""

    @classmethod
    def add_to(cls, parser):
        """Add the options to ``parser`` class by class from the base, each class's fields in the order
        it declares them. A field declared again with :func:`option` is added again (a parser with
        conflict_handler="resolve" keeps the latest), one declared again as a plain default only
        changes its default."""
        final = {f.name: f for f in fields(cls)}
        for klass in reversed(cls.__mro__):
            own = vars(klass).get("__dataclass_fields__", {})
            for name in vars(klass).get("__annotations__", {}):
                f = own[name]
                if not f.metadata:
                    continue
                kw = {k: v for k, v in f.metadata.items() if k not in ("flag", "positional")}
                kw["action"] = _action(f)
                if final[name].default is not MISSING:
                    kw["default"] = final[name].default
                if not f.metadata["positional"]:
                    kw["dest"] = name
                parser.add_argument(*_flags(f), **kw)
        return parser

    @classmethod
    def add_command(cls, subparsers, name, **kw):
        """The subcommand ``name`` with these options; parsed, it is read back by :meth:`from_namespace`."""
        p = cls.add_to(subparsers.add_parser(name, **kw))
        p.set_defaults(options=cls)
        return p

    @classmethod
    def from_namespace(cls, ns):
        """The options an argparse namespace of :meth:`add_to`'s parser holds."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if f.init and hasattr(ns, f.name)})


def to_argv(opts, cls, skip=()):
    """The command line that gives ``cls``'s parser the values of ``opts``: every option of ``cls``
    that ``opts`` holds at another value than ``cls``'s default, except those named in ``skip``."""
    argv = []
    for f in fields(cls):
        if not f.metadata or f.metadata["positional"] or f.name in skip:
            continue
        value = getattr(opts, f.name)
        if value == f.default:
            continue
        action = _action(f)
        if action in ("store_true", "store_false"):
            argv.append(_flag(f))
        elif action == "append":
            argv += [x for v in value for x in (_flag(f), str(v))]
        else:
            argv += [_flag(f), str(value)]
    return argv


class Flags(argparse.Action):
    """An option whose value is another command's flags in one string (``--fairseq-args "--fp16"``):
    with :class:`CommandParser` the word after it is its value even when it starts with ``-``."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (unknown option, a value that is not a number)
    are one line ``PROG: error: ...`` and exit 2, like the project's other errors. The value of a
    :class:`Flags` option may start with ``-`` (argparse alone takes ``--fairseq-args --fp16`` for
    two options): ``OPTION VALUE`` is read as ``OPTION=VALUE``. An option that names a folder or a file
    (``--publish DIR``, any option whose metavar is one of :data:`PATH_METAVARS`) given as an empty text is
    refused: it would name no path, or the working folder."""

    PATH_METAVARS = ("DIR", "PAGE", "FILE", "PATH")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", "flags", Flags)

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        flags = {s for a in self._actions if isinstance(a, Flags) for s in a.option_strings}
        joined = []
        while args:
            arg = args.pop(0)
            if arg == "--":
                joined += [arg, *args]
                break
            joined.append(f"{arg}={args.pop(0)}" if arg in flags and args else arg)
        namespace, extras = super().parse_known_args(joined, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None) if action.option_strings else None
            if (action.dest == "publish" or action.metavar in self.PATH_METAVARS) and isinstance(value, str) \
                    and not value.strip():
                self.error(f"argument {'/'.join(action.option_strings)}: {value!r} names no folder or file: give "
                           f"its path")
        return namespace, extras

    def error(self, message):
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see --help)\n")


def whole_number(minimum):
    """argparse type: a whole number of at least ``minimum``."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small: give at least {minimum}")
        return value
    return parse


def finite_float(text):
    """argparse type: a finite number (``inf`` and ``nan`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


@dataclass(frozen=True)
class Range:
    """The numbers an option takes, said as the messages say it: "at least 1", "positive", "in [0, 1)"."""
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = True

    def __contains__(self, value):
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    @property
    def text(self):
        low, high = (str(v) if isinstance(v, int) else f"{v:g}" for v in (self.low, self.high))
        if self.high == math.inf:
            return "positive" if self.low == 0 and self.low_open else f"at least {low}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"

    def check(self, name, value):
        """``value`` if it is in the range, else an :class:`LnposError`: ``NAME must be ..., got VALUE``."""
        check(value in self, f"{name} must be {self.text}, got {value}")
        return value


class _ListProblem(Exception):
    pass


# what a bad item is not, by the function that reads the items
ITEM_WORDS = {int: "a whole number", float: "a number", str: "a value"}


def _items(value, item, choices, what):
    words = [w.strip() for w in value.split(",")] if isinstance(value, str) else [str(v).strip() for v in value]
    words = [w for w in words if w]
    if not words:
        raise _ListProblem(f"{value!r} lists nothing: give one or more, separated by commas")
    what = what or ITEM_WORDS.get(item, "a value")
    values = []
    for w in words:
        if choices is not None and w not in choices:
            raise _ListProblem(f"{w!r} is not {what}: choose from {', '.join(choices)}")
        try:
            values.append(item(w))
        except ValueError:
            raise _ListProblem(f"{w!r} is not {what}") from None
        if values[-1] in values[:-1]:
            raise _ListProblem(f"{w!r} is listed twice")
    return values


def comma_list(value, option, item=str, choices=None, what=None):
    """The items of ``value``, the comma-separated list an option takes (``option`` names it in
    messages; a list or tuple of items is read the same way): spaces around an item are dropped and
    empty items (``a,,b``, a trailing comma) skipped; each item is read by ``item`` (``int``,
    ``float``, any function of a string that raises ValueError for a bad one) and, with ``choices``,
    must be one of them. No item at all, a bad item or an item listed twice is an
    :class:`LnposError` naming the option: ``--seeds: 'x' is not a whole number``. ``what``: what an
    item is, for the messages ("a variant"; default by ``item``: "a whole number", "a number")."""
    try:
        return _items(value, item, choices, what)
    except _ListProblem as e:
        raise LnposError(f"{option}: {e}") from None


def comma_list_type(item=str, choices=None, what=None):
    """argparse type of :func:`comma_list` (argparse names the option); the items joined by commas."""
    def parse(text):
        try:
            return ",".join(map(str, _items(text, item, choices, what)))
        except _ListProblem as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def fraction(name):
    """argparse type of option ``--name``: a number strictly between 0 and 1."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if value not in Range(0, 1, low_open=True):
            raise argparse.ArgumentTypeError(f"{text}: give a fraction between 0 and 1")
        return value
    parse.__name__ = name
    return parse


def named_fraction(what, example, names=None):
    """argparse type of ``WHAT=F`` (0 < F <= 1; WHAT one of ``names`` when given): (WHAT, F)."""
    def parse(text):
        name, _, value = text.rpartition("=")
        try:
            f = float(value)
        except ValueError:
            f = math.nan
        if not name or (names is not None and name not in names) or not 0 < f <= 1:
            one_of = [f"{what} one of {', '.join(names)}"] if names is not None else []
            raise argparse.ArgumentTypeError(f"{text!r}: give {what}=F with {' and '.join(one_of + ['0 < F <= 1'])}, "
                                             f"e.g. {example}")
        return name, f
    return parse


def at_least(minimum, name, value):
    """``value`` if it is >= ``minimum``, else an :class:`LnposError` naming option ``name``."""
    return Range(minimum).check(name, value)
