"""``--task translation_lnpos``: fairseq's ``translation`` plus per-layer gradient-norm logging.

Models it builds never take upstream fairseq 0.12.2's fused encoder inference path, which fails
with torch >= 2.0 on padded batches (``models.variant.without_fused_inference``); the grid's
evaluation generates through this task.

Bad input is one line, not a traceback: the data folder is checked before fairseq reads it
(``data.bindir.check_data_dir``: missing folder, language pair, missing, empty or damaged
``dict.*.txt``), a missing split names its files, and a checkpoint that cannot be read or does not
fit the model raises ``checkpoint.CheckpointError`` (fairseq-train's resume and ``--restore-file``,
fairseq-generate's ``--path``).

fairseq's trainer calls ``task.train_step`` once per micro-batch (``--update-freq``), then
divides the summed gradients by the sample size (``optimizer.multiply_grads``; for fp16/bf16
optimizers this only updates a pending factor that also holds 1/loss-scale) and then calls
``optimizer.clip_grad_norm``. That call is the first place where the gradient of the mean loss
of the whole update is final, so on logging updates the task wraps it: norms are taken from
the parameters' ``.grad`` times the optimizer's pending ``_multiply_factor`` (1 when absent),
before clipping changes anything. On other updates the wrapper only compares two integers. The
per-group norms go to grad_norms.jsonl only; fairseq's log line gets one number, ``gnorm/layer_max``
(the largest norm of a whole layer), so that a line stays short whatever the depth.

``--log-diagnostics`` (:mod:`fairseq_lnpos.diagnostics`) measures each logged update around
fairseq's ``task.optimizer_step`` (update ratios, Adam's step sizes) and, with forward hooks
installed for that update's micro-batches only, the attention logits and entropies and the output
logits; it writes ``diagnostics.jsonl`` into --save-dir.

``--cpu-autocast-bf16`` (``fairseq_lnpos.precision``) runs the criterion, i.e. the model's forward
and the loss, under ``torch.autocast("cpu", dtype=torch.bfloat16)`` in ``train_step`` and in
``valid_step`` alike, so that a run's validation loss is that of the model it trains, measured as
its training loss is; the backward pass, the parameters and the optimizer state stay float32.
Generation (fairseq-generate, ``--eval-bleu``'s decoding inside ``valid_step``) decodes in float32.
It is refused (one line) on a GPU, beside ``--fp16``, ``--bf16`` or ``--amp``, and on a CPU without
bfloat16 instructions.
"""
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field

from fairseq import metrics
from fairseq.dataclass import FairseqDataclass  # noqa: F401  (keeps fairseq's import order)
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from fairseq_lnpos.checkpoint import guard_checkpoint_loading, guard_state_loading
from fairseq_lnpos.common import DIAGNOSTICS_JSONL, GRAD_NORMS_JSONL, open_log
from fairseq_lnpos.data.bindir import check_data_dir
from fairseq_lnpos.data.download import DataError
from fairseq_lnpos.diagnostics import Diagnostics, parse_updates
from fairseq_lnpos.errors import LnposError, check
from fairseq_lnpos.gradnorm import LAYER_GROUP, GradNormPlan, finite_or_none
from fairseq_lnpos.models.variant import without_fused_inference
from fairseq_lnpos.precision import FLAG as AUTOCAST_FLAG
from fairseq_lnpos.precision import AutocastCriterion, check_cpu_autocast

logger = logging.getLogger(__name__)

JSONL_NAME = GRAD_NORMS_JSONL
TAG_PREFIX = "gnorm/"
# the one number of the log line (and TensorBoard): the largest gradient norm of a whole layer
LOG_LINE_KEY = TAG_PREFIX + "layer_max"
# fairseq imports the plugin while it parses the command line, before fairseq-train creates --save-dir
LOADED_AT = time.time()


@dataclass
class TranslationLnposConfig(TranslationConfig):
    log_grad_norms: bool = field(
        default=False,
        metadata={
            "help": "log per-layer gradient norms of the mean loss (before clipping) to grad_norms.jsonl in "
            "--save-dir, and the largest per-layer norm as gnorm/layer_max in the train log lines and TensorBoard"
        },
    )
    grad_norm_interval: int = field(
        default=0,
        metadata={"help": "log gradient norms every N updates (0: use --log-interval)"},
    )
    log_diagnostics: bool = field(
        default=False,
        metadata={
            "help": "write per-layer training diagnostics to diagnostics.jsonl in --save-dir: update ratio "
            "||dW||/||W||, Adam's step sizes lr/(sqrt(v_hat)+eps), max attention logit and attention entropy, "
            "output logit norm, and the top Hessian eigenvalue at --diagnostics-hessian-updates"
        },
    )
    diagnostics_interval: int = field(
        default=0, metadata={"help": "diagnostics every N updates (0: use --log-interval)"}
    )
    diagnostics_first: int = field(
        default=0, metadata={"help": "also diagnose each of the first N updates"}
    )
    diagnostics_hessian_updates: str = field(
        default="",
        metadata={"help": "comma-separated updates at which to estimate the top Hessian eigenvalue by power "
                  "iteration (tiny models: each costs about 2 x --diagnostics-hessian-iters backward passes)"},
    )
    diagnostics_hessian_iters: int = field(
        default=20, metadata={"help": "power iterations per Hessian estimate"}
    )
    cpu_autocast_bf16: bool = field(
        default=False,
        metadata={
            "help": "CPU mixed precision: the forward pass and the loss of training and validation "
            "under torch.autocast('cpu', bfloat16); parameters, gradients and optimizer state stay "
            "float32 (--bf16 casts the whole model instead). Needs a CPU with bfloat16 instructions "
            "(AVX-512 BF16 or AMX); generation decodes in float32"
        },
    )
    # taken from the rest of the config (not command-line options of the task)
    log_interval: int = II("common.log_interval")
    save_dir: str = II("checkpoint.save_dir")
    distributed_rank: int = II("distributed_training.distributed_rank")
    fp16: bool = II("common.fp16")
    bf16: bool = II("common.bf16")
    amp: bool = II("common.amp")
    cpu: bool = II("common.cpu")


def pending_grad_scale(optimizer):
    """The factor fairseq still has to apply to ``.grad`` at ``clip_grad_norm`` time.

    fp16/bf16 optimizers (``FP16Optimizer``, ``MemoryEfficientFP16Optimizer``) keep
    1/(loss scale * sample size) in ``_multiply_factor``; ``--amp`` unscales inside
    ``clip_grad_norm`` (its ``multiply_grads`` already divided by the sample size);
    fp32 optimizers have multiplied the gradients in place.
    """
    factor = getattr(optimizer, "_multiply_factor", None)
    if factor is not None:
        return factor
    scaler = getattr(optimizer, "_grad_scaler", None)
    if scaler is not None:
        return 1.0 / float(scaler.get_scale())
    return 1.0


class GradNormLogger:
    """Wraps an optimizer's ``clip_grad_norm`` to record norms on every ``interval``-th update."""

    def __init__(self, interval, jsonl_path=None):
        check(interval >= 1, f"--grad-norm-interval must be at least 1 (got {interval}); "
              "0 means --log-interval")
        self.interval = interval
        self.jsonl_path = jsonl_path
        self.update_num = 0  # fairseq's update counter before the step being computed
        self.model = None
        self.plan = None
        self.last = None  # (group norms, per-parameter norms) of the last logged update

    def is_logging_update(self):
        return (self.update_num + 1) % self.interval == 0

    def attach(self, optimizer, model, update_num):
        self.update_num = update_num
        if model is not self.model:
            self.model, self.plan = model, None
        if getattr(optimizer, "_lnpos_gradnorm_logger", None) is self:
            return
        original = optimizer.clip_grad_norm

        def clip_grad_norm(max_norm, *args, **kwargs):
            if not self.is_logging_update():
                return original(max_norm, *args, **kwargs)
            norms = self.measure(pending_grad_scale(optimizer))
            result = original(max_norm, *args, **kwargs)  # raises on fp16 overflow: nothing logged
            amp_overflow = hasattr(optimizer, "_grad_scaler") and not math.isfinite(float(result))
            if not amp_overflow:  # --amp retries the same update after an overflow
                self.record(norms, optimizer)
            return result

        optimizer.clip_grad_norm = clip_grad_norm
        optimizer._lnpos_gradnorm_logger = self

    def measure(self, scale=1.0):
        if self.plan is None:
            self.plan = GradNormPlan(self.model)
        return self.plan.compute(scale)

    def record(self, norms, optimizer=None):
        groups, params = norms
        self.last = norms
        layer_max = max((v for g, v in groups.items() if LAYER_GROUP.match(g) and math.isfinite(v)), default=None)
        if layer_max is not None:  # priority after fairseq's own stats; no rounding (6 digits)
            metrics.log_scalar(LOG_LINE_KEY, layer_max, weight=1, priority=1000, round=None)
        if self.jsonl_path is None:
            return
        rec = {"update": self.update_num + 1, "time": round(time.time(), 3)}
        if optimizer is not None:
            try:
                rec["lr"] = optimizer.get_lr()
            except Exception:  # an optimizer without param groups yet
                pass
        rec["norms"] = {g: finite_or_none(v) for g, v in groups.items()}
        os.makedirs(os.path.dirname(self.jsonl_path) or ".", exist_ok=True)
        with open_log(self.jsonl_path) as f:
            f.write(json.dumps(rec) + "\n")


def check_half_precision(cfg):
    """fairseq-train --fp16 without a CUDA GPU fails in fairseq's FP16Optimizer with an
    AssertionError ("Torch not compiled with CUDA enabled"); fairseq has no half-precision training
    on the CPU (its --bf16 implies --tpu)."""
    import torch

    if getattr(cfg, "fp16", False) and (getattr(cfg, "cpu", False) or not torch.cuda.is_available()):
        raise LnposError("--fp16 needs a CUDA GPU (fairseq trains in half precision on GPUs only; its --bf16 "
                         "needs a TPU): drop --fp16 to train on the CPU")


def _remove_new_empty_folder(path):
    """fairseq-train creates --save-dir (default ./checkpoints) before it sets the task up: on bad
    data or a refused option, remove it again if it is empty and this run made it (changed after
    the plugin loaded)."""
    try:
        if path and os.path.isdir(path) and not os.listdir(path) and os.stat(path).st_mtime >= LOADED_AT:
            os.rmdir(path)
    except Exception:  # save_dir not resolvable (a task config alone) or removed meanwhile: leave it
        pass


def make_diagnostics(cfg):
    """The :class:`~fairseq_lnpos.diagnostics.Diagnostics` of ``--log-diagnostics`` (rank 0 writes the file)."""
    interval = cfg.diagnostics_interval or cfg.log_interval
    rank0 = (getattr(cfg, "distributed_rank", 0) or 0) == 0
    path = os.path.join(cfg.save_dir, DIAGNOSTICS_JSONL) if rank0 and cfg.save_dir else None
    diagnostics = Diagnostics(interval, cfg.diagnostics_first, parse_updates(cfg.diagnostics_hessian_updates),
                              cfg.diagnostics_hessian_iters, path)
    logger.info(f"diagnostics every {interval} updates" + (f" and the first {cfg.diagnostics_first}"
                if cfg.diagnostics_first else "") + (f" to {path}" if path else ""))
    return diagnostics


@register_task("translation_lnpos", dataclass=TranslationLnposConfig)
class TranslationLnposTask(TranslationTask):
    """fairseq's translation task; ``--log-grad-norms`` adds per-layer gradient norms."""

    cfg: TranslationLnposConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.grad_norm_logger = None
        if getattr(cfg, "log_grad_norms", False):
            interval = cfg.grad_norm_interval or cfg.log_interval
            rank0 = (getattr(cfg, "distributed_rank", 0) or 0) == 0
            path = os.path.join(cfg.save_dir, JSONL_NAME) if rank0 and cfg.save_dir else None
            self.grad_norm_logger = GradNormLogger(interval, path)
            logger.info(
                f"logging per-layer gradient norms every {interval} updates"
                + (f" to {path} and the train log" if path else "")
            )
        self.diagnostics = None
        if getattr(cfg, "log_diagnostics", False):
            self.diagnostics = make_diagnostics(cfg)
        self.autocast = bool(getattr(cfg, "cpu_autocast_bf16", False))
        if self.autocast:
            logger.info(f"{AUTOCAST_FLAG}: training and validation forward passes in bfloat16 autocast, "
                        "parameters and optimizer state in float32")

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        try:
            cfg.source_lang, cfg.target_lang = check_data_dir(cfg.data, cfg.source_lang, cfg.target_lang)
            if getattr(cfg, "cpu_autocast_bf16", False):
                import torch

                check_cpu_autocast(cfg.cpu, torch.cuda.is_available(), cfg.fp16, cfg.bf16, cfg.amp)
        except LnposError:  # bad data (DataError) or a refused --cpu-autocast-bf16
            _remove_new_empty_folder(getattr(cfg, "save_dir", None))
            raise
        guard_checkpoint_loading()
        return super().setup_task(cfg, **kwargs)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        try:
            return super().load_dataset(split, epoch, combine, **kwargs)
        except FileNotFoundError as e:  # fairseq: "Dataset not found: <split> (<folder>)"
            raise DataError(f"{e}: that split is not in the data folder; binarize it with fairseq-preprocess "
                            "or choose another subset") from None

    def build_model(self, cfg, from_checkpoint=False):
        if not from_checkpoint:  # a model to train (fairseq-generate decodes in fp16 on a CPU too)
            check_half_precision(self.cfg)
        # fairseq's own Post-LN included: see without_fused_inference (upstream fairseq 0.12.2)
        model = without_fused_inference(super().build_model(cfg, from_checkpoint))
        return guard_state_loading(model, getattr(cfg, "arch", None) or getattr(cfg, "_name", "?"))

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if self.grad_norm_logger is not None:
            self.grad_norm_logger.attach(optimizer, model, update_num)
        if self.autocast:
            criterion = AutocastCriterion(criterion)
        if self.diagnostics is not None and not ignore_grad:  # forward hooks on logged updates only
            return self.diagnostics.train_step(sample, model, criterion, update_num, lambda: super(
                TranslationLnposTask, self).train_step(sample, model, criterion, optimizer, update_num, ignore_grad))
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def optimizer_step(self, optimizer, model, update_num):
        if self.diagnostics is None:
            return super().optimizer_step(optimizer, model, update_num)
        return self.diagnostics.optimizer_step(optimizer, model, update_num, lambda: super(
            TranslationLnposTask, self).optimizer_step(optimizer, model, update_num))

    def valid_step(self, sample, model, criterion):
        if self.autocast:
            criterion = AutocastCriterion(criterion)
        return super().valid_step(sample, model, criterion)
