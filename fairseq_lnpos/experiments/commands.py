"""A run of the table (runs.py) as fairseq command lines, and everything that determines its results.

:class:`Job` is the plan of one run x seed: its fairseq-train argv (``train_cmd``), its fairseq-generate
argv (``generate_argv``), its config and config hash. Nothing here starts a process.
"""
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..errors import LnposError
from ..launch import config_hash, generate_cmd, script, train_args
from ..precision import BF16_AUTOCAST, FLAG as CPU_AUTOCAST_FLAG
from ..variants import DEFAULT_INIT, arch_name, arch_names
from . import runs as R
from .rundir import RunDir
from .options import RunOptions

# output length when scoring: at most 1.2 x source + 10 tokens, as fairseq's IWSLT recipe
# (examples/translation/README.md) passes in --eval-bleu-args; --uncapped-len gives fairseq's
# default (max_len_a 0, max_len_b 200), which lets an untrained model write 200 tokens a sentence
LEN_CAP = ("--max-len-a", "1.2", "--max-len-b", "10")


# fairseq-train flags that would delete, never write or move a checkpoint the grid still scores,
# averages or resumes from (it deletes each checkpointN.pt itself once it is scored)
CHECKPOINT_FLAGS = {
    "--keep-last-epochs": "deletes epoch checkpoints before they are scored or averaged",
    "--no-epoch-checkpoints": "writes no epoch checkpoint to score",
    "--no-save": "writes no checkpoint to score or resume from",
    "--no-last-checkpoints": "writes no checkpoint_last.pt to resume from",
    "--save-interval": "writes no checkpoint of the epochs in between (--eval-every N scores fewer of them)",
    "--save-dir": "moves the checkpoints out of the run folder",
    "--checkpoint-suffix": "renames the checkpoints the grid looks for",
}

# one run on several GPUs: fairseq's own all-reduce after the backward pass (``--ddp-backend legacy_ddp``,
# also called no_c10d), which gives a parameter without a gradient in an update a zero one; PyTorch's
# DDP (fairseq's default) stops at the next update when a parameter got no gradient, as some do under
# upstream fairseq 0.12.2. Both distributions have the option; the gradient is the same average, and it is
# not part of the config.
DDP_FLAGS = ("--ddp-backend", "legacy_ddp")


def split_flags(text, option):
    """Command-line flags in one string, split as a shell does; unbalanced quotes are an error."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise LnposError(f"{option} {text}: {e}: quote the flags as a shell does") from None


def check_train_flags(flags, option):
    """Refuse the fairseq-train flags of :data:`CHECKPOINT_FLAGS` (or an abbreviation fairseq would
    take for one) among ``flags``, which come from ``option``."""
    for token in flags:
        name = token.split("=", 1)[0]
        for flag, effect in CHECKPOINT_FLAGS.items():
            if name == flag or (len(name) >= 6 and flag.startswith(name)):
                raise LnposError(f"{option}: {name} {effect}, and the grid needs every checkpoint it has not "
                                 f"scored yet: drop it (the grid deletes each checkpointN.pt once it is scored; "
                                 f"--keep-checkpoints keeps them)")


def run_arch(run, size):
    """The fairseq arch of ``run`` at ``size`` ("paper": the dataset's own size, or "tiny")."""
    return arch_name(run.ln, "tiny" if size == "tiny" else R.DATASETS[run.dataset]["arch_size"])


def batch_plan(run, world):
    """(--max-tokens, --update-freq) so that one update sees ``run.batch_tokens`` tokens."""
    per_step = run.max_tokens * world
    if run.batch_tokens % per_step == 0:
        return run.max_tokens, run.batch_tokens // per_step
    if run.batch_tokens < per_step and run.batch_tokens % world == 0:
        return run.batch_tokens // world, 1
    raise LnposError(
        f"{run.name}: an update of {run.batch_tokens} tokens cannot be split over {world} GPU(s) x "
        f"{run.max_tokens} tokens; pick --set max_tokens=N with N x GPUs dividing {run.batch_tokens}")


def optimizer_args(run):
    if run.decoupled_weight_decay and run.optimizer != "radam":
        raise LnposError(f"{run.name}: decoupled_weight_decay is an option of radam (fairseq's adam always "
                         f"decouples its weight decay, sgd has none): --set decoupled_weight_decay=false")
    if run.optimizer == "sgd":
        return ["--optimizer", "sgd", "--momentum", str(run.momentum), "--weight-decay", str(run.weight_decay)]
    return ["--optimizer", run.optimizer, "--adam-betas", run.adam_betas, "--adam-eps", str(run.adam_eps),
            "--weight-decay", str(run.weight_decay)] + (["--decoupled-weight-decay"] if run.decoupled_weight_decay else [])


def _nowarmup_flags(run, total):
    if run.warmup > 1:
        raise LnposError(f"{run.name}: schedule inverse_sqrt_nowarmup has no warm-up: --set warmup=0")
    return ["--decay-period", str(run.decay_period)]


# every schedule of runs.SCHEDULES (tests/test_optim.py checks it): its fairseq --lr-scheduler and its
# flags beyond --lr, flags(run, total updates)
SCHEDULE_FLAGS = {
    # the paper's: warm-up to lr, held until decay_anchor, then lr * sqrt(A / t); the paper's
    # T_warmup = 1 means no warm-up: the first update runs at lr_max
    "inverse_sqrt": ("warmup_inverse_sqrt", lambda run, total: [
        "--warmup-updates", str(max(run.warmup, 1)), "--decay-anchor", str(max(run.decay_anchor, run.warmup, 1))]),
    # fairseq's own: from --warmup-init-lr to lr, then lr * sqrt(T / t)
    "fairseq_inverse_sqrt": ("inverse_sqrt", lambda run, total: [
        "--warmup-updates", str(max(run.warmup, 1)), "--warmup-init-lr", str(run.warmup_init_lr)]),
    # T-Fixup's: lr * sqrt(A / (A + t)), A = decay_period
    "inverse_sqrt_nowarmup": ("inverse_sqrt_nowarmup", _nowarmup_flags),
    "step_decay": ("step_decay", lambda run, total: [
        "--decay-epoch", str(run.decay_epoch), "--decay-factor", str(run.decay_factor),
        *(["--inverse-sqrt-after-decay"] if run.inverse_sqrt_after_decay else [])]),
    # --power 1: warm-up from 0, then down to end_lr at the last update; fairseq's --warmup-updates 1
    # would run the first update at lr 0: a warm-up of 1 is none
    "linear": ("polynomial_decay", lambda run, total: [
        "--power", "1", "--end-learning-rate", str(run.end_lr), "--warmup-updates", str(run.warmup if run.warmup > 1 else 0),
        "--total-num-update", str(total)]),
    "fixed": ("fixed", lambda run, total: []),
}


def schedule_args(run, total_updates):
    """--lr-scheduler, --lr and the flags of the run's schedule (:data:`SCHEDULE_FLAGS`)."""
    if run.warmup_init_lr and run.schedule != "fairseq_inverse_sqrt":
        raise LnposError(f"{run.name}: warmup_init_lr is an option of schedule fairseq_inverse_sqrt only "
                         f"(the others warm up from 0): --set warmup_init_lr=0")
    if run.schedule not in SCHEDULE_FLAGS:
        raise LnposError(f"{run.name}: unknown schedule {run.schedule!r}")
    scheduler, flags = SCHEDULE_FLAGS[run.schedule]
    return ["--lr-scheduler", scheduler, "--lr", str(run.lr), *flags(run, total_updates)]


SHARE_FLAGS = {"none": [], "decoder": ["--share-decoder-input-output-embed"], "all": ["--share-all-embeddings"]}


def model_args(run, arch):
    """Dropouts, embedding sharing and the initialization (``--lnpos-init``, an option of the plugin's archs)."""
    init = []
    if arch in arch_names():
        init = ["--lnpos-init", run.init]
    elif run.init != DEFAULT_INIT:
        raise LnposError(f"{run.name}: init {run.init} needs one of the plugin's archs (--arch {arch} is not): "
                         f"drop --arch or --set init={DEFAULT_INIT}")
    return ["--dropout", str(run.dropout), "--attention-dropout", str(run.attention_dropout),
            "--activation-dropout", str(run.activation_dropout), *SHARE_FLAGS[run.share_embeddings], *init]


def check_joined_dictionary(run, data, langs):
    """--share-all-embeddings needs one dictionary for both languages (fairseq-preprocess
    --joined-dictionary); fairseq itself would fail only once training starts, with a traceback."""
    if run.share_embeddings != "all":
        return
    src, tgt = (Path(data) / f"dict.{lang}.txt" for lang in langs)
    words = [[line.split(" ", 1)[0] for line in p.read_text(encoding="utf-8").splitlines()] for p in (src, tgt)]
    if words[0] != words[1]:
        raise LnposError(f"{run.name} shares all embeddings (--share-all-embeddings), but {src.name} and {tgt.name} "
                         f"of {data} differ: binarize with fairseq-preprocess --joined-dictionary (data-prep/*.sh do), "
                         f"or --set share_embeddings=decoder")


def depth_args(run):
    if not run.layers:
        return []
    return ["--encoder-layers", str(run.layers), "--decoder-layers", str(run.layers)]


def budget_args(run):
    """--max-epoch, and --max-update when the run's budget is counted in updates."""
    return ["--max-epoch", str(run.max_epoch)] + (["--max-update", str(run.max_update)] if run.max_update else [])


@dataclass(frozen=True)
class Job:
    """The plan of one run x seed; what the grid does with it and how far it got is the scheduler's
    (scheduler.Progress)."""
    run: R.Run
    seed: int
    data: Path
    run_dir: Path
    arch: str
    langs: tuple
    opts: RunOptions  # the grid's options (or SweepOptions, SlurmOptions)
    index: int = 0    # its place among the grid's jobs, from 1
    cpu: bool = False  # it takes a CPU slot: its fairseq commands get --cpu, whatever GPUs the machine has
    placement: str = None  # where a dry run says it trains (plan.placement), e.g. "GPU 4"

    @property
    def label(self):
        return f"{self.run.name} seed {self.seed}" + (f" on {self.placement}" if self.placement else "")

    @property
    def dir(self):
        return RunDir(self.run_dir)

    @property
    def save_dir(self):
        return self.dir.save_dir

    def config(self):
        """Everything that determines the results (not the GPUs used, nor how often it is scored)."""
        o = self.opts
        return {"run": self.run.as_dict(), "seed": self.seed, "data": str(self.data), "arch": self.arch,
                "fp16": o.fp16, "fairseq_args": o.fairseq_args, "beam": self.run.beam, "lenpen": self.run.lenpen,
                "gen_args": self.gen_extra(),
                **({"precision": BF16_AUTOCAST} if o.cpu_bf16 else {})}  # float32 runs: the hash of earlier ones

    def config_hash(self):
        return config_hash(self.config())

    def train_cmd(self, total_updates="<updates per epoch x {e}>", display=False):
        r, o = self.run, self.opts
        max_tokens, update_freq = batch_plan(r, o.world)
        if isinstance(total_updates, str):
            total_updates = total_updates.format(e=r.max_epoch)
        exe = "fairseq-train" if display else script("fairseq-train")
        cmd = [exe, *train_args(
            self.data, self.arch, max_tokens=max_tokens, task=self.task, langs=self.langs,
            model=[*depth_args(r), *model_args(r, self.arch)],
            optim=[*optimizer_args(r), "--clip-norm", str(r.clip_norm), *schedule_args(r, total_updates)],
            label_smoothing=r.label_smoothing, budget=["--update-freq", str(update_freq), *budget_args(r)],
            seed=self.seed, save_dir=self.save_dir, log_format="json", log_interval=o.log_interval)]
        cmd += self.unread_work_args()
        if self.cpu:
            cmd += ["--cpu"]
        if o.world > 1:
            cmd += ["--distributed-world-size", str(o.world), *DDP_FLAGS]
        if o.fp16:
            cmd += ["--fp16"]
        if o.cpu_bf16:
            cmd += [CPU_AUTOCAST_FLAG]
        return cmd + list(r.extra) + split_flags(o.fairseq_args, "--fairseq-args")

    @property
    def task(self):
        """The fairseq task: the grid's --task, else the row's; under --cpu-bf16 fairseq's ``translation``
        is the plugin's ``translation_lnpos`` (the same task, with the autocast option)."""
        task = self.opts.task or self.run.task
        if self.opts.cpu_bf16 and task in (None, "translation"):
            return "translation_lnpos"
        return task

    def unread_work_args(self):
        """fairseq-train flags that skip the validations nothing reads: a sweep's cell without BLEU
        (its budget in updates) is read at its last update only (the final validation NLL; a run
        stopped early or diverged counts by its outcome), so fairseq validates at ``--max-update``
        and not at the epoch ends before it. Training is the same update for update (fairseq seeds
        each update and each epoch's batches itself), and the epoch checkpoints are still written:
        an interrupted run resumes from them. Not part of the config (nor its hash): they change
        what is logged, not the results. ``grid.sh sweep --validate-each-epoch`` keeps every
        validation."""
        o, r = self.opts, self.run
        if o.final_validation_only and o.no_bleu and r.max_update:
            return ["--validate-after-updates", str(r.max_update)]
        return []

    def gen_extra(self):
        """fairseq-generate flags beyond the data, checkpoint, beam and length penalty: decoding is
        fp32 under --fp16 unless the row's ``decode_fp16`` (T-Fixup and the RAdam repository decoded
        in fp32, Transformer-Clinic with --fp16: docs/published.md)."""
        o = self.opts
        cap = [] if o.uncapped_len else list(LEN_CAP)
        return cap + (["--fp16"] if o.fp16 and self.run.decode_fp16 else []) + split_flags(o.gen_args, "--gen-args")

    def device_args(self):
        """fairseq-generate's flags of the device: ``--cpu`` for a run of a CPU slot (not part of the
        config: where a run is scored does not change its hypotheses' definition)."""
        return ["--cpu"] if self.cpu else []

    def generate_argv(self, epoch, manifest, display=False, checkpoint=None):
        """fairseq-generate of epoch ``epoch``'s checkpoint (or of the file ``checkpoint``)."""
        checkpoint = self.dir.checkpoint(epoch) if checkpoint is None else checkpoint
        cmd = generate_cmd(self.data, checkpoint, manifest, self.run.beam, self.run.lenpen,
                           extra=[*self.gen_extra(), *self.device_args()])
        if display:
            cmd[0] = "fairseq-generate"
        return cmd

    def scored(self, epoch):
        """Is ``epoch`` scored on the test set? Every --eval-every'th epoch and always the last."""
        if self.opts.no_bleu:
            return False
        return epoch == self.run.max_epoch or epoch % self.opts.eval_every == 0


def total_updates(job):
    """Updates of the whole run: its --max-update, else updates per epoch (fairseq's own parsing and
    batching of ``job``'s training data) x epochs. The linear decay needs it up front."""
    if job.run.max_update:
        return job.run.max_update
    from ..fairseq_build import quiet, setup

    with quiet():
        _, cfg, task = setup(job.train_cmd(1)[1:])
        task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
        itr = task.get_batch_iterator(
            task.dataset(cfg.dataset.train_subset), max_tokens=cfg.dataset.max_tokens,
            max_sentences=cfg.dataset.batch_size, max_positions=task.max_positions(),
            ignore_invalid_inputs=True, required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
            seed=job.seed, num_shards=job.opts.world, shard_id=0, epoch=1)
    return math.ceil(len(itr) / cfg.optimization.update_freq[0]) * job.run.max_epoch
