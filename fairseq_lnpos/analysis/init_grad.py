"""Fig. 3 of Xiong et al. (2020) at initialization, and the Lemma 2 residual-stream norms.

    python -m fairseq_lnpos.analysis.init_grad [--data BIN] [--out analysis-out] [--paper] ...

For every architecture in ``--archs``, depth in ``--depths`` and seed: build the model as
fairseq-train would (seeded), draw K mini-batches of ``--tokens`` tokens (fairseq's own batching,
shuffled by the seed; the same batches for every model of a seed), and for each FFN weight
matrix record

* the paper's statistic: average the gradient over the K batches element by element, then take
  the Frobenius norm (``mean_grad``);
* the mean over batches of the per-batch gradient norm (``batch_norm``: what Theorem 1 bounds);
* with ``--spectral``, the spectral norm (largest singular value) of the batch-averaged gradient
  (``mean_grad_spectral``), another reading of "the norm" of a matrix (an SVD per matrix).

The loss is fairseq's: label-smoothed cross-entropy summed over target tokens divided by their
number (the gradient fairseq's trainer steps with); models are in training mode (dropout on).
Per-layer W1/W2 norms (Fig. 3a/b) come from the ``--layers-depth`` models; for the other depths
only the last layer's W2 needs a gradient (Fig. 3c/d), so autograd skips the rest. The Lemma 2
check runs one extra forward pass in eval mode (no dropout) on the deepest models and records
||x||^2 / d at the input of every LayerNorm, averaged over the non-padding positions.

Each model's record is written to ``<out>/models/`` as it finishes (:func:`Measurement.file`); a rerun with
the same settings skips the models recorded there (``--fresh`` starts over). At the end
``records.jsonl`` (every record, one a line), ``fig3.json`` and the PNGs are written
(fairseq_lnpos.analysis.plots). :func:`run` is :func:`plan`, :func:`resume`, :func:`measure` per
job and :func:`finish`.
"""
import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Tuple

from fairseq_lnpos.common import RESULTS, fmt_time, read_json, write_json, write_text
from fairseq_lnpos.cli import CommandParser, Options as CommandOptions, Range, at_least, comma_list, option, whole_number
from fairseq_lnpos.errors import MAX_SEED, LnposError, check, run_main
from fairseq_lnpos.experiments.sweep import width_args
from fairseq_lnpos.launch import config_hash, train_args
from fairseq_lnpos.progress import Cadence
from fairseq_lnpos.variants import GROUPS, INITS, SIZES, VARIANTS, arch_name

PROG = "init_grad_analysis"
DEFAULTS = {"tokens": 256, "batches": 2, "seeds": 2}
PAPER = {"tokens": 4096, "seeds": 10}  # Sec. 3.4: ten seeds; 4096-token batches as in training


@dataclasses.dataclass
class Options(CommandOptions):
    """What to measure: one field per command-line option (the parser is generated from them)."""
    data: Optional[str] = option(help="binarized data dir (fairseq-preprocess output); default: a generated "
                                 "in-memory corpus (8000-word Markov source, mapped/reordered target)")
    split: Optional[str] = option(help="split of --data to draw batches from (default: train, else valid)")
    source_lang: Optional[str] = option(flag=("--source-lang", "-s"))
    target_lang: Optional[str] = option(flag=("--target-lang", "-t"))
    archs: Tuple[str, ...] = option(
        GROUPS["paper"],
        help=f"comma-separated: variants ({', '.join(VARIANTS)}: transformer_<variant>_<size>) or "
             f"full fairseq arch names (default: {','.join(GROUPS['paper'])})")
    size: str = option("iwslt_de_en", "size of the variants' archs: iwslt_de_en (6+6, d 512, FFN 1024, 4 heads; "
                       "the paper's IWSLT model, default), wmt_en_de, tiny, or base ('' = base)")
    model_args: str = option("", "extra fairseq model options, one quoted string, e.g. "
                                 "\"--encoder-embed-dim 64 --decoder-embed-dim 64\" (for quick looks and tests)",
                             action="flags")
    width: Optional[int] = option(type=whole_number(1), help="model width d (embeddings d, FFN 4d), as the sweeps' "
                                  "--width, e.g. --size tiny --width 96 for the map of every architecture "
                                  "(default: the size's own)")
    init: Optional[str] = option(
        choices=INITS, help="the plugin archs' --lnpos-init (default fairseq-0.12, fairseq 0.12's own; "
                            "fairseq-0.8: Xavier FFNs and zero biases, the fairseq of the paper's time)")
    vocab: int = option(8000, "word types of the generated corpus (no --data)", type=int)
    depths: Tuple[int, ...] = option((6, 8, 10, 12, 14), "encoder = decoder layers of the depth sweep (Fig. 3c/d)")
    layers_depth: int = option(6, "depth whose per-layer W1/W2 norms are plotted (Fig. 3a/b); default 6", type=int)
    seeds: Optional[int] = option(help=f"number of seeds (default {DEFAULTS['seeds']}; --paper: 10)", type=int)
    first_seed: int = option(1, type=int)
    tokens: Optional[int] = option(help=f"max tokens per mini-batch (default {DEFAULTS['tokens']}; --paper: 4096)",
                                   type=int)
    batches: Optional[int] = option(help=f"mini-batches K averaged per model (default {DEFAULTS['batches']}; "
                                         "the paper does not say)", type=int, flag=("--batches", "-K"))
    paper: bool = option(False, "the paper's setting: 10 seeds, 4096-token batches")
    dropout: float = option(0.1, "dropout (paper's IWSLT setting 0.1)", type=float)
    label_smoothing: float = option(0.1, type=float)
    checkpoint: Optional[str] = option(help="a fairseq checkpoint (e.g. Post-LN after warm-up) to add to "
                                            "Fig. 3a/b; needs the --data it was trained on")
    checkpoint_label: str = option("Post-LN after warm-up")
    lemma2: bool = option(True, "skip the Lemma 2 forward passes", flag="--no-lemma2")
    spectral: bool = option(False, "also the spectral norm of the batch-averaged gradient (an SVD per matrix)")
    out: str = option("analysis-out", "output folder (default analysis-out/)")
    fresh: bool = option(False, "ignore results of an earlier run in --out")
    threads: Optional[int] = option(help="torch CPU threads (default: torch's choice)", type=int)
    publish: Optional[str] = option(help="also write the results as a results page into this folder "
                                    "(docs/results/NAME): the command, machine, tables, figures and records.jsonl")
    device: str = option("cpu", "cpu or cuda")

    def __post_init__(self):  # seeds, tokens, batches not given: the defaults, or the paper's with --paper
        for key, value in DEFAULTS.items():
            if getattr(self, key) is None:
                setattr(self, key, PAPER.get(key, value) if self.paper else value)

    def validate(self):
        """Normalise the lists and range-check every value; raises :class:`LnposError`."""
        self.archs = comma_list(self.archs, "--archs", what="a variant or arch name")
        check(self.size in SIZES or self.size == "", f"--size {self.size!r}: one of {', '.join(SIZES)} ('' = base)")
        width_args(self.width)  # a width the heads divide
        self.depths = sorted(comma_list(self.depths, "--depths", int))
        check(min(self.depths) >= 1, "--depths must list positive layer counts, e.g. 6,8,10,12,14")
        check(self.layers_depth in self.depths,
              f"--layers-depth {self.layers_depth} is not in --depths {self.depths}")
        for name in ("seeds", "tokens", "batches", "vocab"):
            at_least(1, "--" + name, getattr(self, name))
        Range(0, MAX_SEED - self.seeds + 1, high_open=False).check("--first-seed", self.first_seed)
        if self.threads is not None:
            at_least(1, "--threads", self.threads)
        for name in ("dropout", "label_smoothing"):
            value = getattr(self, name)
            check(0 <= value < 1, f"--{name.replace('_', '-')} must be in [0, 1), got {value}")
        check(self.device.split(":")[0] in ("cpu", "cuda"), f"--device {self.device!r}: cpu or cuda")
        check(not self.checkpoint or self.data, "--checkpoint needs --data: the binarized data dir whose "
              "dictionaries the checkpoint was trained with")
        check(not self.source_lang == (self.target_lang is None),
              "give --source-lang and --target-lang together")
        return self


def parse_args(argv=None):
    """:class:`Options` from the command line."""
    p = Options.add_to(CommandParser(
        prog="init_grad_analysis.sh",
        description="Gradient norms of the FFN weights at initialization (Xiong et al. 2020, Fig. 3) "
        "and residual-stream norms (Lemma 2).",
    ))
    return Options.from_namespace(p.parse_args(argv)).validate()


# ---------------------------------------------------------------- models and data

def resolve_arch(name, size):
    """``postln`` -> ``(transformer_postln_iwslt_de_en, Post-LN)``; full names pass through."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    if name in VARIANTS:
        return arch_name(name, size or "base"), VARIANTS[name].label
    if name not in ARCH_MODEL_REGISTRY:
        raise LnposError(f"unknown architecture {name!r} in --archs: use {', '.join(VARIANTS)} (with --size) or "
                         "a registered fairseq arch name such as transformer_postln_iwslt_de_en")
    return name, name


def fairseq_argv(arch, layers, opts, data="-"):
    """fairseq-train's arguments for one model of the analysis (the project's recipe, fairseq's task)."""
    model = ["--dropout", str(opts.dropout), *width_args(opts.width), *shlex.split(opts.model_args)]
    if opts.init:
        model += ["--lnpos-init", opts.init]
    if layers is not None:
        model += ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    langs = (opts.source_lang, opts.target_lang) if opts.source_lang else None
    return train_args(data, arch, max_tokens=opts.tokens, task="translation", langs=langs, model=model,
                      label_smoothing=opts.label_smoothing)


def load_data(opts):
    """``(task, dataset, description)``: a fairseq TranslationTask over --data or generated data.
    Fills in ``opts.source_lang``/``target_lang`` when they are not given."""
    from fairseq_lnpos import fairseq_build

    if opts.data is None:
        from fairseq.tasks.translation import TranslationTask

        from fairseq_lnpos.analysis.toy_corpus import make_corpus

        src_dict, tgt_dict, dataset = make_corpus(
            n_sentences=max(2000, opts.tokens * opts.batches // 10), vocab=opts.vocab)
        opts.source_lang, opts.target_lang = opts.source_lang or "src", opts.target_lang or "tgt"
        task = TranslationTask(fairseq_build.parse(fairseq_argv(arch_name("postln"), None, opts)), src_dict, tgt_dict)
        return task, dataset, f"generated Markov corpus ({len(dataset)} pairs, {len(tgt_dict)} types)"
    from fairseq_lnpos.data.bindir import check_data_dir
    from fairseq_lnpos.data.manifest import ManifestError, read_manifest

    data = Path(opts.data)
    if opts.source_lang is None and data.is_dir():
        try:
            m = read_manifest(data)
            opts.source_lang, opts.target_lang = m["source_lang"], m["target_lang"]
        except ManifestError:  # a folder binarized without the data-prep scripts: its file names tell
            pass
    opts.source_lang, opts.target_lang = check_data_dir(data, opts.source_lang, opts.target_lang)
    split = opts.split or ("train" if list(data.glob("train.*.idx")) else "valid")
    _, _, task = fairseq_build.setup(fairseq_argv(arch_name("postln"), None, opts, data=str(data)))
    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        raise LnposError(f"{e}: --split {split} is not in {data}") from None
    dataset = task.dataset(split)
    return task, dataset, f"{data} [{split}] ({len(dataset)} pairs, {len(task.target_dictionary)} types)"


def draw_batches(task, dataset, tokens, k, seed):
    itr = task.get_batch_iterator(
        dataset, max_tokens=tokens, max_positions=(1024, 1024), ignore_invalid_inputs=True,
        seed=seed, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=True)
    out = []
    for sample in itr:
        out.append(sample)
        if len(out) == k:
            break
    if len(out) < k:
        raise LnposError(f"the data has only {len(out)} batches of {tokens} tokens: lower --batches or --tokens")
    return out


def load_checkpoint_model(task, path, dropout):
    from fairseq import checkpoint_utils

    from fairseq_lnpos.checkpoint import guard_checkpoint_loading

    guard_checkpoint_loading()  # an unreadable file: CheckpointError naming it
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state["cfg"].model
    from omegaconf import open_dict

    # the same dropout as the models built at initialization (cfg.model is a Namespace or a DictConfig)
    values = {"dropout": dropout, "attention_dropout": 0.0, "activation_dropout": 0.0}
    if isinstance(cfg, argparse.Namespace):
        for key, value in values.items():
            setattr(cfg, key, value)
    else:
        with open_dict(cfg):
            for key, value in values.items():
                if key in cfg:
                    cfg[key] = value
    model = task.build_model(cfg)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg)
    except RuntimeError as e:
        raise LnposError(f"--checkpoint {path} does not fit --data {task.cfg.data} ({str(e).splitlines()[0][:200]}"
                         "...): pass the data dir the checkpoint was trained on") from None
    layers = len(model.encoder.layers)
    return model, cfg.arch, layers


# ---------------------------------------------------------------- measurements

def ffn_weights(model):
    """``{(stack, layer, "fc1"|"fc2"): parameter}`` via the shared name parser."""
    from fairseq_lnpos.gradnorm import parse_name

    out = {}
    for name, p in model.named_parameters():
        stack, layer, sub, leaf = parse_name(name)
        if layer is not None and sub in ("fc1", "fc2") and leaf == "weight":
            out[(stack, layer, sub)] = p
    return out


def gradient_stats(model, criterion, samples, wanted, spectral=False):
    """Mean-over-batches gradient norm, mean per-batch norm and (``spectral``) the spectral norm of
    the mean gradient of the ``wanted`` weights (None without)."""
    import torch

    model.train()
    for p in model.parameters():
        p.requires_grad_(False)
    for p in wanted.values():
        p.requires_grad_(True)
    params = list(wanted.values())
    acc = [torch.zeros_like(p) for p in params]
    batch_norms = torch.zeros(len(params), dtype=torch.float64)
    for sample in samples:
        for p in params:
            p.grad = None
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        grads = [p.grad for p in params]
        batch_norms += torch.stack(torch._foreach_norm(grads, 2)).double().cpu()
        torch._foreach_add_(acc, grads)
    torch._foreach_div_(acc, len(samples))
    mean_norms = torch.stack(torch._foreach_norm(acc, 2)).double().cpu()
    spectral_norms = [float(torch.linalg.matrix_norm(a.double(), ord=2)) if spectral else None for a in acc]
    for p in params:
        p.grad = None
    batch_norms /= len(samples)
    return {key: (float(m), float(b), s) for key, m, b, s in zip(wanted, mean_norms, batch_norms, spectral_norms)}


def lemma2_stats(model, sample):
    """||x||^2 / d at the input of every LayerNorm, in forward order, eval mode."""
    import torch

    model.eval()
    records, hooks = [], []
    masks = {}
    for stack_name in ("encoder", "decoder"):
        stack = getattr(model, stack_name)
        for name, module in stack.named_modules():
            if not isinstance(module, torch.nn.LayerNorm) and "LayerNorm" not in type(module).__name__:
                continue
            from fairseq_lnpos.gradnorm import parse_name

            _, layer, sub, _ = parse_name(f"{stack_name}.{name}.weight")
            if layer is None and sub not in ("final_ln", "embed_ln"):
                continue

            def hook(mod, inputs, stack_name=stack_name, layer=layer, sub=sub):
                x = inputs[0].float()  # T x B x C
                keep = masks[stack_name]
                sq = x.pow(2).sum(-1) / x.shape[-1]
                records.append((stack_name, layer, sub, float(sq[keep].mean())))

            hooks.append(module.register_forward_pre_hook(hook))
    net = sample["net_input"]
    pad = model.encoder.padding_idx
    masks["encoder"] = net["src_tokens"].ne(pad).t()
    masks["decoder"] = net["prev_output_tokens"].ne(model.decoder.padding_idx).t()
    try:
        with torch.no_grad():
            model(**net)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for stack_name, layer, sub, value in records:
        out.setdefault(stack_name, []).append(
            {"layer": layer, "ln": sub, "sq_norm_over_d": value})
    return out


# ---------------------------------------------------------------- driver

def settings_of(opts, data_desc):
    s = {k: getattr(opts, k) for k in ("tokens", "batches", "dropout", "label_smoothing", "size", "model_args",
                                       "first_seed", "split", "data", "checkpoint")}
    if opts.init:  # absent when not given, so results of earlier versions still resume
        s["init"] = opts.init
    if opts.width:
        s["width"] = opts.width
    if opts.spectral:
        s["spectral"] = True
    s["data_desc"] = data_desc
    return s


MODELS = "models"  # the folder of the per-model records under --out


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One model of the analysis: ``arch`` at ``depth`` layers built with ``seed``, or (``checkpoint``)
    a trained model at its own depth. ``full``: every layer's W1 and W2 (Fig. 3a/b), else the last
    layer's W2 only; ``lemma2``: also the Lemma 2 forward pass."""
    label: str
    arch: Optional[str]
    depth: Optional[int]
    seed: int
    full: bool
    lemma2: bool
    checkpoint: Optional[str] = None

    def cost(self, layers_depth):
        """The relative time of the job: forward + backward through the model; the depth-sweep models
        backpropagate mostly through the decoder only; a Lemma 2 pass is one forward."""
        depth = self.depth or layers_depth
        return depth * (3.0 if self.full else 2.2) + (depth if self.lemma2 else 0) + 2.0

    def file(self, out):
        """Where the job's record is kept: ``<out>/models/<label>-depth<D>-seed<S>.json``."""
        label = re.sub(r"[^A-Za-z0-9_.+-]+", "_", self.label)
        depth = "checkpoint" if self.depth is None else f"depth{self.depth}"
        return Path(out) / MODELS / f"{label}-{depth}-seed{self.seed}.json"

    def made(self, rec, key):
        """Is ``rec`` this job's record, measured with the settings of hash ``key``?"""
        return (isinstance(rec, dict) and rec.get("settings_key") == key
                and [rec.get(k) for k in ("label", "depth_requested", "seed", "full")]
                == [self.label, self.depth, self.seed, self.full] and (not self.lemma2 or "lemma2" in rec))

    def __str__(self):
        return f"{self.label} depth {self.depth} seed {self.seed}"


def plan(opts, archs):
    """The jobs, in the order they run: per seed, every arch of ``archs`` ((name, arch, label) of
    :func:`resolve_arch`) at every depth, then the checkpoint."""
    deepest, jobs = max(opts.depths), []
    for seed in range(opts.first_seed, opts.first_seed + opts.seeds):
        jobs += [Measurement(label, arch, depth, seed, full=depth == opts.layers_depth, lemma2=depth == deepest and opts.lemma2)
                 for _, arch, label in archs for depth in opts.depths]
        if opts.checkpoint:
            jobs.append(Measurement(opts.checkpoint_label, None, None, seed, full=True, lemma2=False, checkpoint=opts.checkpoint))
    return jobs


def resume(out, jobs, key, fresh=False):
    """``{job: record}`` of the jobs whose record ``<out>/models/`` holds, measured with the settings of
    hash ``key`` (as the grid keeps a run's outcome in its folder): those are not measured again. A
    record of other settings is measured again and replaced; ``fresh`` removes every record first."""
    folder = Path(out) / MODELS
    if fresh and folder.is_dir():
        for path in folder.glob("*.json"):
            path.unlink()
    folder.mkdir(exist_ok=True)
    done = {}
    for job in jobs:
        rec = read_json(job.file(out), missing_ok=True, what_to_do="delete it to measure that model again")
        if job.made(rec, key):
            done[job] = rec
    return done


def measure(job, opts, task, samples, key):
    """The record of one job: its FFN gradient norms over ``samples`` (and the Lemma 2 norms)."""
    from fairseq_lnpos import fairseq_build

    t0 = time.time()
    if job.checkpoint:
        model, arch, depth = load_checkpoint_model(task, job.checkpoint, opts.dropout)
        fargs = fairseq_build.parse(fairseq_argv(arch, depth, opts, data=opts.data))
    else:
        arch, depth = job.arch, job.depth
        built = fairseq_build.build(fairseq_argv(arch, depth, opts), seed=job.seed, task=task)
        fargs, model = built.args, built.model
    model.to(opts.device)
    if hasattr(model, "profile_if_due"):  # Admin: w is profiled on a training batch, as fairseq-train does
        model.profile_if_due(**samples[0]["net_input"])
    criterion = task.build_criterion(fargs)
    weights = ffn_weights(model)
    if not job.full:
        weights = {k: p for k, p in weights.items() if k[2] == "fc2" and k[1] == depth - 1}
    stats = gradient_stats(model, criterion, samples, weights, opts.spectral)
    rec = {"settings_key": key, "label": job.label, "arch": arch, "depth": depth,
           "depth_requested": job.depth, "seed": job.seed, "full": job.full,
           "d": model.encoder.embed_tokens.embedding_dim,
           "normalize_before": bool(getattr(fargs, "encoder_normalize_before", False)),
           "tokens": [int(s["ntokens"]) for s in samples],
           "mean_grad": {}, "batch_norm": {}, **({"mean_grad_spectral": {}} if opts.spectral else {})}
    for (stack, layer, w), values in sorted(stats.items()):
        for name, value in zip(("mean_grad", "batch_norm", "mean_grad_spectral"), values):
            if name in rec:
                rec[name].setdefault(stack, {}).setdefault(w, [None] * depth)[layer] = value
    if job.lemma2:
        rec["lemma2"] = lemma2_stats(model, samples[0])
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def finish(out, records, settings, opts, t_start, command=None):
    """``records.jsonl`` (every model's record, one a line), ``fig3.json``, ``fig3.md`` and the figures,
    and with ``opts.publish`` a results page of them; returns fig3.json's content."""
    import torch

    from fairseq_lnpos.analysis import plots, summary as summarize

    write_text(out / "records.jsonl", "".join(json.dumps(rec) + "\n" for rec in records))
    result = summarize.summarize(records, settings, depths=opts.depths, layers_depth=opts.layers_depth,
                                 seeds=opts.seeds, lemma2=opts.lemma2)
    result["seconds"] = round(time.time() - t_start, 1)
    result["cpu_seconds"] = round(time.process_time(), 1)
    write_json(out / "fig3.json", result)
    md = summarize.markdown(result)
    write_text(out / "fig3.md", md)
    written = plots.plot_all(result, out)
    if opts.publish:
        from .publish import publish

        title = "Fig. 3 and Lemma 2 at initialization: " + ", ".join(result["settings"]["archs"])
        written.append(publish(opts.publish, title, md, None, [out / "fig3.json", out / "records.jsonl", *written],
                               command or f"scripts/init_grad_analysis.sh --out {out} --publish {opts.publish}"))
    print(summarize.headline(result))
    print(f"wrote {out / 'fig3.json'}, {out / 'fig3.md'}, {', '.join(str(p) for p in written)}")
    wall, cpu = time.time() - t_start, time.process_time()
    print(f"time taken: {fmt_time(wall)} ({wall:.0f} s wall, {cpu:.0f} s CPU over "
          f"{torch.get_num_threads()} threads)")
    return result


# the benchmark page of a checkout of the repository (scripts/bench.sh --publish): it times these defaults
BENCHMARK = RESULTS / "benchmarks" / "bench.json"
MEASURED_SETTINGS = ("data", "archs", "size", "model_args", "depths", "seeds", "tokens", "batches", "vocab",
                     "checkpoint", "spectral", "lemma2", "device")  # the defaults: what the benchmark times


def measured_time(bench=BENCHMARK):
    """What the benchmark page's ``bench.json`` measured of the defaults ("138 s on 2 cores in the last
    benchmark ..."), or None where there is no page (an installed copy) or it did not time them."""
    try:
        result = read_json(bench, missing_ok=True) or {}
    except LnposError:  # a page that cannot be read is no reason not to run
        return None
    seconds = result.get("fig3_analysis_seconds")
    if not isinstance(seconds, (int, float)):
        return None
    return f"{seconds:.0f} s on {result.get('cpu_count')} cores in the last benchmark (docs/results/benchmarks)"


def expected_time(opts, models, bench=BENCHMARK):
    """What the start line says of the time ``models`` models of ``opts`` take: the benchmark page's time
    where they are the defaults' 20 models at d 512 (:func:`measured_time`), else that it was not measured."""
    defaults, measured = Options(), measured_time(bench)
    same = all(tuple(getattr(opts, f)) == tuple(getattr(defaults, f)) if f in ("archs", "depths")
               else getattr(opts, f) == getattr(defaults, f) for f in MEASURED_SETTINGS)
    if measured is None:
        return f"not measured for these {models} models (no benchmark page beside this code: scripts/bench.sh --publish)"
    if same:
        return f"{measured} for these {models} models (the defaults)"
    return (f"not measured for these {models} models (--size {opts.size or 'base'}); the 20 models of the "
            f"defaults at d 512 took {measured}")


def process_start_time():
    """Wall-clock start of this process (Linux), so that 'time taken' includes the imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def main(argv=None):
    """The command: options from ``argv``; one line and exit 2 for bad input, 130 for Ctrl-C."""
    t_start = process_start_time() if argv is None else None

    def command(argv):
        from .publish import argv_of

        run(parse_args(argv), t_start, command=argv_of("scripts/init_grad_analysis.sh", argv))

    return run_main(PROG, command, argv)


def run(opts, t_start=None, command=None):
    """Measure every job of :func:`plan` that :func:`resume` does not find done, keeping each record in
    ``<out>/models/`` as it is measured, then :func:`finish` (``command``: the command line a results page
    names); return fig3.json's content. Raises :class:`LnposError` for bad input."""
    opts = opts.validate()
    t_start = time.time() if t_start is None else t_start
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    check(opts.device == "cpu" or torch.cuda.is_available(),
          f"--device {opts.device}: torch {torch.__version__} sees no GPU here; use --device cpu")
    from fairseq_lnpos import register
    from fairseq_lnpos.data.pipeline import check_writable_folder

    register()  # the plugin's archs, for resolve_arch
    archs = [(name,) + resolve_arch(name, opts.size) for name in opts.archs]
    out = Path(opts.out)
    check_writable_folder(out, "--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LnposError(f"--out {out}: cannot create the folder ({e.strerror}): choose a writable folder") from None
    task, dataset, data_desc = load_data(opts)
    settings = settings_of(opts, data_desc)
    key = config_hash(settings)
    jobs = plan(opts, archs)
    done = resume(out, jobs, key, opts.fresh)

    print(f"init_grad_analysis: {len(jobs)} models ({', '.join(l for _, _, l in archs)}"
          f"{', ' + opts.checkpoint_label if opts.checkpoint else ''}; depths {opts.depths}; "
          f"seeds {list(range(opts.first_seed, opts.first_seed + opts.seeds))}), K={opts.batches} batches of <= {opts.tokens} tokens, "
          f"data: {data_desc}, {torch.get_num_threads()} threads", flush=True)
    print(f"expected time: {expected_time(opts, len(jobs))}; an ETA follows each model", flush=True)
    remaining = sum(j.cost(opts.layers_depth) for j in jobs if j not in done)
    spent_cost, spent_time = 0.0, 0.0
    batches, records = {}, []
    now = {"job": None, "i": 0, "since": time.time()}  # the model being measured, for the status line

    def eta():
        return fmt_time(spent_time / spent_cost * (remaining - spent_cost)) if spent_cost else "?"

    def status():
        print(f"[{now['i']}/{len(jobs)}] {now['job']}: measuring ({time.time() - now['since']:.0f} s so far; "
              f"elapsed {fmt_time(time.time() - t_start)}, ETA {eta()})", flush=True)

    with Cadence(status) as cadence:
        for i, job in enumerate(jobs, 1):
            if job in done:
                records.append(done[job])
                print(f"[{i}/{len(jobs)}] {job}: done earlier (from {job.file(out)})", flush=True)
                cadence.printed()
                continue
            now.update(job=job, i=i, since=time.time())
            if job.seed not in batches:
                batches = {job.seed: [_to(s, torch.device(opts.device))
                                      for s in draw_batches(task, dataset, opts.tokens, opts.batches, job.seed)]}
            rec = measure(job, opts, task, batches[job.seed], key)
            write_json(job.file(out), rec)
            records.append(rec)
            spent_cost += job.cost(opts.layers_depth)
            spent_time += rec["seconds"]
            depth = rec["depth"]
            last = {s: rec["mean_grad"][s]["fc2"][depth - 1] for s in ("encoder", "decoder")}
            print(f"[{i}/{len(jobs)}] {job.label} depth {depth} seed {job.seed}: last-layer W2 grad norm "
                  f"enc {last['encoder']:.3f} dec {last['decoder']:.3f} ({rec['seconds']:.1f} s; elapsed "
                  f"{fmt_time(time.time() - t_start)}, ETA {eta()})", flush=True)
            cadence.printed()
    return finish(out, records, settings, opts, t_start, command)


def _to(sample, device):
    from fairseq import utils

    return sample if device.type == "cpu" else utils.move_to_cuda(sample, device=device)


if __name__ == "__main__":
    sys.exit(main())
