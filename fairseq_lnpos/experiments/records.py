"""The records of a run folder (rundir.py) and of the evaluator, as dataclasses.

    DoneRecord     DONE.json: the outcome (:class:`Outcome`, with reason, diverged_at, stopped_at)
                   and the statistics of the training
    EpochRecord    eval/epochN.json: fairseq's statistics of epoch N and its scores when it was scored
    AverageRecord  eval/average.json: the average of the last N epoch checkpoints, scored
    Scores         what scoring a checkpoint gives (evaluate.py, the evaluator's answer)
    ScoreRequest   what the grid asks the evaluator to score

    config.json    everything that determines a run's results (:func:`config_from_json`; its ``run`` has
                   the shape of :class:`~.runs.Run`)

Every writer and reader goes through them: ``to_json()`` gives the JSON object written, ``from_json``
checks an object read (its shape, :func:`shape`, derived from the fields) and makes the record.
A field that is null in a record is left out of the JSON unless it is marked ``written`` (written as
null); fields a file holds that a record does not know are not read. DONE.json keeps a ``status``,
the outcome in words (:attr:`DoneRecord.text`) for the people who read the file, never read back.
This is the only schema of the run files: folders written by earlier versions are brought to it by
``scripts/grid.sh migrate`` (migrate.py).
"""
import dataclasses
import enum

from ..common import is_plain_name
from ..errors import StateError
from .runs import LATER_FIELDS, Run


# ---------------------------------------------------------------- the kinds of JSON values

@dataclasses.dataclass(frozen=True)
class Kind:
    """A JSON value's expected kind: ``name`` for messages, ``test(value)``."""
    name: str
    test: object

    def __call__(self, value):
        return self.test(value)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


INT = Kind("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = Kind("a number", _number)
STRING = Kind("a string", lambda v: isinstance(v, str))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
PLAIN_NAME = Kind("a plain name (letters, digits, '_', '.', '+', '-'; no '/', no '..')", is_plain_name)


def optional(kind):
    return Kind(f"{kind.name} or null", lambda v: v is None or kind(v))


def list_of(kind):
    return Kind(f"a list of {kind.name.split(' ', 1)[1]}s", lambda v: isinstance(v, list) and all(map(kind, v)))


def one_of(values):
    return Kind("one of " + ", ".join(f"'{v}'" for v in values), lambda v: v in values)


def short(value):
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def shape_error(path, what, problem, what_to_do):
    return StateError(f"{path} is not {what} the grid writes ({problem}): {what_to_do}")


def check_shape(obj, shape, path, what, what_to_do, where=""):
    """``obj`` (read from ``path``) as ``shape`` ({field: (kind, required)}) says, else :class:`StateError`."""
    if not isinstance(obj, dict):
        raise shape_error(path, what, f"it holds {short(obj)}, not an object", what_to_do)
    for key, (kind, required) in shape.items():
        if key not in obj:
            if required:
                raise shape_error(path, what, f"no '{where}{key}'", what_to_do)
        elif not kind(obj[key]):
            raise shape_error(path, what, f"'{where}{key}' is {short(obj[key])}, not {kind.name}", what_to_do)
    return obj


# ---------------------------------------------------------------- records

def spec(kind, default=None, written=False, required=False):
    """A record field of JSON kind ``kind``: ``required`` in every file, else ``default`` when absent
    (a field whose default is None may be null too); ``written``: written also when it is null."""
    meta = {"kind": kind, "written": written}
    if required:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Record:
    """The JSON side of a record dataclass: its shape, ``to_json`` and ``from_json``."""

    @classmethod
    def shape(cls):
        """{field: (kind, required)} of the JSON object, derived from the fields."""
        out = {}
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            kind = f.metadata["kind"]
            out[f.name] = (optional(kind) if not required and f.default is None else kind, required)
        return out

    def to_json(self):
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.metadata["written"]:
                out[f.name] = value.value if isinstance(value, enum.Enum) else \
                    list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, obj, path="a record", what="a record", what_to_do="delete it"):
        """The record of ``obj`` (read from ``path``), checked: :class:`StateError` names ``path``,
        what it should be and ``what_to_do``."""
        return cls._build(check_shape(obj, cls.shape(), path, what, what_to_do))

    @classmethod
    def _build(cls, obj):
        """The record of the fields of (checked) ``obj`` that it knows."""
        return cls(**{f.name: tuple(obj[f.name]) if isinstance(obj[f.name], list) else obj[f.name]
                      for f in dataclasses.fields(cls) if f.name in obj})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scores(Record):
    """A checkpoint scored on the test set (evaluate.score_hyps; the evaluator adds eval_seconds)."""
    bleu_tok: float = spec(NUMBER)                 # fairseq's scorer on the data's tokens, the paper's
    n_sentences: int = spec(INT)
    bleu_tok_settings: str = spec(STRING)
    no_hypothesis: int = spec(INT)                 # sentences fairseq-generate wrote no hypothesis for
    bleu_tok_cs: float = spec(NUMBER)              # with the compounds split (a row's compound_split_bleu)
    sacrebleu: float = spec(NUMBER)
    sacrebleu_signature: str = spec(STRING)
    length_ratio: float = spec(NUMBER)             # hypothesis tokens / reference tokens (evaluate.output_shape)
    repeat_4gram: float = spec(NUMBER)             # mean share of repeated 4-grams within a hypothesis
    eval_seconds: float = spec(NUMBER)

    def scores(self):
        """The fields of :class:`Scores` of this record, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Scores)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpochRecord(Scores):
    """eval/epochN.json: fairseq's statistics of epoch N; its scores once it was scored (bleu_tok null:
    not scored, by --eval-every or --no-bleu)."""
    epoch: int = spec(INT, required=True)
    num_updates: int = spec(INT, written=True)
    valid_loss: float = spec(NUMBER, written=True)
    valid_nll_loss: float = spec(NUMBER, written=True)
    train_loss: float = spec(NUMBER, written=True)
    lr: float = spec(NUMBER, written=True)
    bleu_tok: float = spec(NUMBER, written=True)

    def scored_as(self, scores):
        """This epoch with ``scores`` (:class:`Scores`)."""
        return dataclasses.replace(self, **scores.scores())


@dataclasses.dataclass(frozen=True, kw_only=True)
class AverageRecord(Scores):
    """eval/average.json: the parameter average of the last ``average_last`` epoch checkpoints
    (``epochs``, fewer when the run saved fewer), scored."""
    epochs: tuple = spec(list_of(INT), required=True)
    average_last: int = spec(INT, required=True)
    bleu_tok: float = spec(NUMBER, required=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreRequest(Record):
    """What the evaluator scores: fairseq-generate ``argv`` (no program name) on the data ``data``, its
    hypotheses written to ``hyp_out``; with ``average``, the parameter average of those checkpoints
    is first written to ``checkpoint``; with ``compound_split`` also the compound-split tok BLEU."""
    argv: tuple = spec(list_of(STRING), required=True)
    data: str = spec(STRING, required=True)
    hyp_out: str = spec(STRING, required=True)
    checkpoint: str = spec(STRING, required=True)
    compound_split: bool = spec(BOOL, default=False)
    average: tuple = spec(list_of(STRING), default=())


class Outcome(enum.Enum):
    """How a run ended, as its DONE.json records it; without one, whether it started."""
    FINISHED = "finished"
    DIVERGED = "diverged"
    STOPPED = "stopped early"    # hopeless: its training loss stalled (early_stop.py)
    FAILED = "failed"            # a re-run retries it
    UNFINISHED = "unfinished"    # running, or stopped before its outcome (a re-run resumes it)
    NOT_STARTED = "not started"

    @property
    def final(self):
        """A finished, diverged or early-stopped run is never redone."""
        return self in (Outcome.FINISHED, Outcome.DIVERGED, Outcome.STOPPED)


RECORDED = (Outcome.FINISHED, Outcome.DIVERGED, Outcome.STOPPED, Outcome.FAILED)  # the outcomes of a DONE.json
@dataclasses.dataclass(frozen=True, kw_only=True)
class DoneRecord(Record):
    """DONE.json, written last: the outcome and, for a run that trained to it, its statistics."""
    outcome: Outcome = spec(one_of([o.value for o in RECORDED]), required=True)
    reason: str = spec(STRING)             # why it failed, or was stopped early
    diverged_at: int = spec(INT, written=True)  # the update at which it diverged
    stopped_at: int = spec(INT, written=True)   # the update at which it was stopped early
    epochs: tuple = spec(list_of(INT), written=True)
    initial_loss: float = spec(NUMBER, written=True)
    updates: int = spec(INT, written=True)
    train_seconds: float = spec(NUMBER, written=True)
    train_cpu_seconds: float = spec(NUMBER, written=True)  # absent in older runs, null unknown
    final_valid_loss: float = spec(NUMBER, written=True)
    final_valid_nll: float = spec(NUMBER)       # the last validation NLL (bits, no smoothing); absent in older runs
    unigram_bits: float = spec(NUMBER)          # what a trivial model reaches on the run's data (data/unigram.py)
    peak_rss_mb: float = spec(NUMBER, written=True)
    cuda_peak_mb: float = spec(NUMBER, written=True)
    provenance: dict = spec(OBJECT)             # code, versions and machine (provenance.py); absent in older runs
    precision: str = spec(STRING)  # what it trained in (precision.precision_of); absent in older runs

    @classmethod
    def failed(cls, reason):
        return cls(outcome=Outcome.FAILED, reason=reason)

    @property
    def text(self):
        """The outcome in words: finished, diverged at update N, stopped early at update N: WHY, failed: WHY
        (the update and the reason left out where the record has none)."""
        why = f": {self.reason}" if self.reason else ""
        if self.outcome is Outcome.DIVERGED:
            return "diverged" + ("" if self.diverged_at is None else f" at update {self.diverged_at}")
        if self.outcome is Outcome.STOPPED:
            return "stopped early" + ("" if self.stopped_at is None else f" at update {self.stopped_at}") + why
        if self.outcome is Outcome.FAILED:
            return "failed" + why
        return self.outcome.value

    @classmethod
    def shape(cls):
        return {**super().shape(), "status": (STRING, False)}  # the words: written, never read back

    def to_json(self):
        out = {"status": self.text, **super().to_json()}
        if self.outcome is Outcome.FAILED:  # it did not train to an outcome: no statistics
            out = {k: v for k, v in out.items() if k in ("status", "outcome", "reason", "provenance", "unigram_bits")}
        return out

    @staticmethod
    def words_only(obj):
        """Is ``obj`` a DONE.json of an earlier version, its outcome in words only (migrate.py reads it)?"""
        return isinstance(obj, dict) and "outcome" not in obj and isinstance(obj.get("status"), str)

    @classmethod
    def from_json(cls, obj, path="a record", what="an outcome record", what_to_do="delete it"):
        if cls.words_only(obj):
            raise StateError(f"{path} was written by an earlier version (its outcome in words only): run "
                             f"`scripts/grid.sh migrate OUT` once on its output folder, then again what you ran")
        done = super().from_json(obj, path, what, what_to_do)
        return dataclasses.replace(done, outcome=Outcome(done.outcome))


# ---------------------------------------------------------------- config.json

def _run_shape():
    """The shape of a recorded run (:class:`~.runs.Run`, from its annotations): required where Run has
    no default."""
    kinds = {"str": STRING, "float": NUMBER, "int": INT, "bool": BOOL, "tuple": list_of(STRING)}
    shape = {}
    for f in dataclasses.fields(Run):
        kind = kinds[f.type if isinstance(f.type, str) else f.type.__name__]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        shape[f.name] = (optional(kind) if f.default is None else kind, required)
    shape["figure"] = (PLAIN_NAME, False)  # part of a file name (report.py's fig_<figure>.png)
    return shape


RUN_SHAPE = _run_shape()
# config.json: fields not listed are not read, so not checked
CONFIG_SHAPE = {"hash": (STRING, True), "seed": (INT, True), "arch": (STRING, True), "run": (OBJECT, True),
                "data": (STRING, False), "fp16": (BOOL, False), "fairseq_args": (STRING, False),
                "beam": (INT, False), "lenpen": (NUMBER, False), "gen_args": (list_of(STRING), False),
                "precision": (STRING, False)}  # absent: float32 (or --fp16)
# what a recorded run leaves out is Run's default (Run.as_dict records LATER_FIELDS only when set)
RUN_DEFAULTS = {k: v for k, v in {**Run(name="", dataset="", ln="", optimizer="", lr=0.0).as_dict(), **LATER_FIELDS}.items()
                if k not in ("name", "dataset", "ln", "optimizer", "lr")}


def config_from_json(obj, path="a config", what="a run's config", what_to_do="delete it"):
    """config.json's object, checked (its ``run`` too: :data:`RUN_SHAPE`), with the fields its run leaves
    out set to Run's defaults."""
    check_shape(obj, CONFIG_SHAPE, path, what, what_to_do)
    check_shape(obj["run"], RUN_SHAPE, path, what, what_to_do, where="run.")
    return {**obj, "run": {**RUN_DEFAULTS, **obj["run"]}}
