"""fairseq command-line arguments -> task and model, in this process, the way fairseq-train builds them.

    built = build(["DATA", "--arch", "transformer_preln_tiny", "--task", "translation", ...], seed=1)
    built.args, built.cfg, built.task, built.model

Used wherever the project builds fairseq objects itself (the Fig. 3 analysis, the benchmark, the
grid's parameter count, the tests). It registers the plugin first (:func:`fairseq_lnpos.register`):
fairseq does not import a ``--user-dir`` package that is imported already.
"""
import contextlib
import logging
import threading
import warnings
from collections import namedtuple

Built = namedtuple("Built", "args cfg task model")
# Hydra's compose goes through one process-wide GlobalHydra: two threads composing at once (the
# grid's slots sizing two linear-decay runs) fail with "GlobalHydra is already initialized"
_COMPOSE = threading.Lock()


@contextlib.contextmanager
def quiet():
    """Hold back, inside the block, the deprecation warnings of the hydra version fairseq pins and
    the INFO/DEBUG lines fairseq and hydra log (fairseq's import turns them on): a command of the
    project that builds fairseq objects in its own process would otherwise print dozens of lines."""
    loggers = [logging.getLogger(name) for name in ("fairseq", "fairseq_cli", "hydra")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for lg in loggers:
            lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def to_config(args):
    """fairseq's ``convert_namespace_to_omegaconf``, without hydra's deprecation warnings; one
    thread at a time (:data:`_COMPOSE`)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    with _COMPOSE, quiet():
        return convert_namespace_to_omegaconf(args)


def parse(argv):
    """fairseq-train's parser on ``argv`` (without the program name): the Namespace, with the
    ``--arch`` defaults filled in."""
    from fairseq_lnpos import register

    register()
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])


def setup(argv):
    """``(args, cfg, task)``: the parsed arguments, fairseq's config and the task (dictionaries loaded)."""
    from fairseq import tasks

    args = parse(argv)
    cfg = to_config(args)
    return args, cfg, tasks.setup_task(cfg.task)


def build(argv, seed=None, task=None):
    """:class:`Built` for ``argv``; the model's initialisation is seeded with ``seed`` (torch's
    global generator, as fairseq-train's ``--seed``). ``task``: an existing task to build on
    (e.g. one over an in-memory corpus); ``argv`` still gives the model's options."""
    if task is None:
        args, cfg, task = setup(argv)
    else:
        args = parse(argv)
        cfg = to_config(args)
    if seed is not None:
        import torch

        torch.manual_seed(seed)
    return Built(args, cfg, task, task.build_model(cfg.model))
