"""Command-line options as dataclasses: a field made with :func:`option` is also an option of the
command; :meth:`Options.add_to` generates the argparse parser from the fields (the pattern of
fairseq's ``gen_parser_from_dataclass``, with the types, metavars and appending options the
project's commands need), :meth:`Options.from_namespace` reads the parsed command line back as the
dataclass and :func:`to_argv` writes options back as a command line. Python callers build the
dataclass directly. Used by the grid's commands (``experiments/options.py``) and the Fig. 3
analysis (``analysis/init_grad.py``)."""
from dataclasses import MISSING, field, fields


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
        value = getattr(opts, f.name)
        if not f.metadata or f.metadata["positional"] or f.name in skip or value == f.default:
            continue
        action = _action(f)
        if action in ("store_true", "store_false"):
            argv.append(_flag(f))
        elif action == "append":
            argv += [x for v in value for x in (_flag(f), str(v))]
        else:
            argv += [_flag(f), str(value)]
    return argv
