"""Fig. 3 of Xiong et al. (2020) at initialization, and the Lemma 2 residual-stream norms.

    python -m fairseq_lnpos.analysis.init_grad [--data BIN] [--out analysis-out] [--paper] ...

For every architecture in ``--archs``, depth in ``--depths`` and seed: build the model as
fairseq-train would (seeded), draw K mini-batches of ``--tokens`` tokens (fairseq's own batching,
shuffled by the seed; the same batches for every model of a seed), and for each FFN weight
matrix record

* the paper's statistic: average the gradient over the K batches element by element, then take
  the Frobenius norm (``mean_grad``);
* the mean over batches of the per-batch gradient norm (``batch_norm``: what Theorem 1 bounds).

The loss is fairseq's: label-smoothed cross-entropy summed over target tokens divided by their
number (the gradient fairseq's trainer steps with); models are in training mode (dropout on).
Per-layer W1/W2 norms (Fig. 3a/b) come from the ``--layers-depth`` models; for the other depths
only the last layer's W2 needs a gradient (Fig. 3c/d), so autograd skips the rest. The Lemma 2
check runs one extra forward pass in eval mode (no dropout) on the deepest models and records
||x||^2 / d at the input of every LayerNorm, averaged over the non-padding positions.

Results are appended to ``<out>/records.jsonl`` as each model finishes; a rerun with the same
settings skips what is there (``--fresh`` starts over). At the end ``fig3.json`` and the PNGs
are written (fairseq_lnpos.analysis.plots).
"""
import argparse
import glob
import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

DEFAULTS = {"tokens": 256, "batches": 2, "seeds": 2}
PAPER = {"tokens": 4096, "seeds": 10}  # Sec. 3.4: ten seeds; 4096-token batches as in training
SHORT_ARCHS = ("postln", "preln", "deepnorm", "keel")
LABELS = {"postln": "Post-LN", "preln": "Pre-LN", "deepnorm": "DeepNorm", "keel": "Keel"}


def fail(message):
    print(f"init_grad_analysis: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="init_grad_analysis.sh",
        description="Gradient norms of the FFN weights at initialization (Xiong et al. 2020, Fig. 3) "
        "and residual-stream norms (Lemma 2).",
    )
    p.add_argument("--data", help="binarized data dir (fairseq-preprocess output); default: a generated "
                   "in-memory corpus (8000-word Markov source, mapped/reordered target)")
    p.add_argument("--split", help="split of --data to draw batches from (default: train, else valid)")
    p.add_argument("--source-lang", "-s")
    p.add_argument("--target-lang", "-t")
    p.add_argument("--archs", default="postln,preln",
                   help="comma-separated: short names (postln, preln, deepnorm, keel: "
                   "transformer_<name>_<size>) or full fairseq arch names (default: postln,preln)")
    p.add_argument("--size", default="iwslt_de_en",
                   help="size suffix for short arch names: iwslt_de_en (6+6, d 512, FFN 1024, 4 heads; "
                   "the paper's IWSLT model, default), wmt_en_de, tiny, or '' for base")
    p.add_argument("--model-args", default="",
                   help="extra fairseq model options, one quoted string, e.g. "
                   "\"--encoder-embed-dim 64 --decoder-embed-dim 64\" (for quick looks and tests)")
    p.add_argument("--vocab", type=int, default=8000, help="word types of the generated corpus (no --data)")
    p.add_argument("--depths", default="6,8,10,12,14",
                   help="encoder = decoder layers of the depth sweep (Fig. 3c/d)")
    p.add_argument("--layers-depth", type=int, default=6,
                   help="depth whose per-layer W1/W2 norms are plotted (Fig. 3a/b); default 6")
    p.add_argument("--seeds", type=int, help=f"number of seeds (default {DEFAULTS['seeds']}; --paper: 10)")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--tokens", type=int, help=f"max tokens per mini-batch (default {DEFAULTS['tokens']}; "
                   "--paper: 4096)")
    p.add_argument("--batches", "-K", type=int, help=f"mini-batches K averaged per model "
                   f"(default {DEFAULTS['batches']}; the paper does not say)")
    p.add_argument("--paper", action="store_true", help="the paper's setting: 10 seeds, 4096-token batches")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout (paper's IWSLT setting 0.1)")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--checkpoint", help="a fairseq checkpoint (e.g. Post-LN after warm-up) to add to "
                   "Fig. 3a/b; needs the --data it was trained on")
    p.add_argument("--checkpoint-label", default="Post-LN after warm-up")
    p.add_argument("--no-lemma2", action="store_true", help="skip the Lemma 2 forward passes")
    p.add_argument("--out", default="analysis-out", help="output folder (default analysis-out/)")
    p.add_argument("--fresh", action="store_true", help="ignore results of an earlier run in --out")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args(argv)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, PAPER.get(key, value) if args.paper else value)
    try:
        args.depths = sorted({int(x) for x in args.depths.split(",") if x.strip()})
    except ValueError:
        fail(f"--depths takes comma-separated integers, got {args.depths!r}")
    args.archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    if not args.archs:
        fail("--archs is empty: give e.g. postln,preln")
    for name, value in (("--seeds", args.seeds), ("--tokens", args.tokens), ("--batches", args.batches)):
        if value < 1:
            fail(f"{name} must be at least 1, got {value}")
    if not args.depths or min(args.depths) < 1:
        fail("--depths must list positive layer counts, e.g. 6,8,10,12,14")
    if args.layers_depth not in args.depths:
        fail(f"--layers-depth {args.layers_depth} is not in --depths {args.depths}")
    if args.checkpoint and not args.data:
        fail("--checkpoint needs --data: the binarized data dir whose dictionaries the checkpoint was "
             "trained with")
    return args


# ---------------------------------------------------------------- models and data

def resolve_arch(name, size):
    """``postln`` -> ``(transformer_postln_iwslt_de_en, Post-LN)``; full names pass through."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    if name in SHORT_ARCHS:
        arch = f"transformer_{name}" + (f"_{size}" if size else "")
        label = LABELS[name]
    else:
        arch, label = name, name
    if arch not in ARCH_MODEL_REGISTRY:
        short = [n for n in SHORT_ARCHS if f"transformer_{n}" in ARCH_MODEL_REGISTRY]
        fail(f"unknown architecture {arch!r} in --archs: use {', '.join(short)} (with --size) or a "
             f"registered fairseq arch name such as transformer_postln_iwslt_de_en")
    return arch, label


def fairseq_args(arch, layers, args, data="-"):
    from fairseq import options

    argv = [data, "--task", "translation", "--arch", arch, "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", str(args.label_smoothing), "--dropout", str(args.dropout),
            "--max-tokens", str(args.tokens)]
    argv += shlex.split(args.model_args)
    if layers is not None:
        argv += ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    if args.source_lang:
        argv += ["-s", args.source_lang, "-t", args.target_lang]
    return options.parse_args_and_arch(options.get_training_parser(), argv)


def load_data(args):
    """``(task, dataset, description)``: a fairseq TranslationTask over --data or generated data."""
    from fairseq.tasks.translation import TranslationTask

    if args.data is None:
        from fairseq_lnpos.analysis.synthetic import make_corpus

        src_dict, tgt_dict, dataset = make_corpus(
            n_sentences=max(2000, args.tokens * args.batches // 10), vocab=args.vocab)
        args.source_lang, args.target_lang = args.source_lang or "src", args.target_lang or "tgt"
        task = TranslationTask(fairseq_args("transformer", None, args), src_dict, tgt_dict)
        return task, dataset, f"generated Markov corpus ({len(dataset)} pairs, {len(tgt_dict)} types)"
    data = Path(args.data)
    if not data.is_dir():
        fail(f"--data {data} is not a folder: give a fairseq-preprocess output dir, or omit --data")
    if not args.source_lang:
        langs = sorted(Path(f).name[len("dict."):-len(".txt")] for f in glob.glob(str(data / "dict.*.txt")))
        try:
            from fairseq_lnpos.data.manifest import read_manifest

            m = read_manifest(data)
            args.source_lang, args.target_lang = m["source_lang"], m["target_lang"]
        except Exception:
            if len(langs) != 2:
                fail(f"cannot tell the languages of {data} (dict files: {langs or 'none'}): "
                     "pass --source-lang and --target-lang")
            args.source_lang, args.target_lang = langs
    split = args.split
    if split is None:
        split = "train" if glob.glob(str(data / "train.*.idx")) else "valid"
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(fairseq_args("transformer", None, args, data=str(data)))
    task = TranslationTask.setup_task(cfg.task)
    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        fail(f"{e}: --split {split} is not in {data}")
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
        fail(f"the data has only {len(out)} batches of {tokens} tokens: lower --batches or --tokens")
    return out


def build_model(task, fargs, seed):
    import torch

    torch.manual_seed(seed)
    return task.build_model(fargs)


def load_checkpoint_model(task, path, dropout):
    from fairseq import checkpoint_utils

    import fairseq_lnpos  # noqa: F401  (torch >= 2.6 loading, plugin archs)

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:
        fail(f"cannot load --checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0]}")
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
        fail(f"--checkpoint {path} does not fit --data {task.cfg.data} ({str(e).splitlines()[0][:200]}...): "
             "pass the data dir the checkpoint was trained on")
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


def gradient_stats(model, criterion, samples, wanted):
    """Mean-over-batches gradient norm and mean per-batch norm of the ``wanted`` weights."""
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
    for p in params:
        p.grad = None
    batch_norms /= len(samples)
    return {key: (float(m), float(b)) for key, m, b in zip(wanted, mean_norms, batch_norms)}


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

def settings_of(args, data_desc):
    s = {k: getattr(args, k) for k in ("tokens", "batches", "dropout", "label_smoothing", "size", "model_args",
                                       "first_seed", "split", "data", "checkpoint")}
    s["data_desc"] = data_desc
    return s


def settings_key(settings):
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def job_cost(depth, full, lemma):
    # forward + backward through the model; the depth-sweep models backpropagate mostly through
    # the decoder only; a Lemma 2 pass is one forward
    return depth * (3.0 if full else 2.2) + (depth if lemma else 0) + 2.0


def process_start_time():
    """Wall-clock start of this process (Linux), so that 'time taken' includes the imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def fmt_time(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


def main(argv=None):
    args = parse_args(argv)
    t_start = process_start_time() if argv is None else time.time()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets the root logger up
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    import fairseq_lnpos  # noqa: F401  (registers the plugin archs)
    from fairseq_lnpos.analysis import plots, summary as summarize

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task, dataset, data_desc = load_data(args)
    settings = settings_of(args, data_desc)
    key = settings_key(settings)
    archs = [(name,) + resolve_arch(name, args.size) for name in args.archs]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    deepest = max(args.depths)

    jobs = []
    for seed in seeds:
        for name, arch, label in archs:
            for depth in args.depths:
                jobs.append({"label": label, "arch": arch, "depth": depth, "seed": seed,
                             "full": depth == args.layers_depth,
                             "lemma2": depth == deepest and not args.no_lemma2})
        if args.checkpoint:
            jobs.append({"label": args.checkpoint_label, "arch": None, "depth": None, "seed": seed,
                         "full": True, "lemma2": False, "checkpoint": args.checkpoint})

    records_path = out / "records.jsonl"
    done = {}
    if records_path.exists() and not args.fresh:
        for line in records_path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interruption
            if r.get("settings_key") == key:
                done[(r["label"], r["depth_requested"], r["seed"])] = r
    elif records_path.exists():
        records_path.unlink()

    device = torch.device(args.device)
    print(f"init_grad_analysis: {len(jobs)} models ({', '.join(l for _, _, l in archs)}"
          f"{', ' + args.checkpoint_label if args.checkpoint else ''}; depths {args.depths}; "
          f"seeds {seeds}), K={args.batches} batches of <= {args.tokens} tokens, "
          f"data: {data_desc}, {torch.get_num_threads()} threads", flush=True)
    total_cost = sum(job_cost(j["depth"] or args.layers_depth, j["full"], j["lemma2"]) for j in jobs)
    spent_cost, spent_time = 0.0, 0.0
    batches = {}
    records = []
    for i, job in enumerate(jobs, 1):
        jkey = (job["label"], job["depth"], job["seed"])
        cost = job_cost(job["depth"] or args.layers_depth, job["full"], job["lemma2"])
        if jkey in done:
            records.append(done[jkey])
            total_cost -= cost
            print(f"[{i}/{len(jobs)}] {job['label']} depth {job['depth']} seed {job['seed']}: "
                  f"done earlier (from {records_path})", flush=True)
            continue
        t0 = time.time()
        seed = job["seed"]
        if seed not in batches:
            batches = {seed: [
                _to(s, device) for s in draw_batches(task, dataset, args.tokens, args.batches, seed)]}
        samples = batches[seed]
        if job.get("checkpoint"):
            model, arch, depth = load_checkpoint_model(task, job["checkpoint"], args.dropout)
            fargs = fairseq_args(arch, depth, args, data=args.data)
        else:
            arch, depth = job["arch"], job["depth"]
            fargs = fairseq_args(arch, depth, args)
            model = build_model(task, fargs, seed)
        model.to(device)
        criterion = task.build_criterion(fargs)
        weights = ffn_weights(model)
        if not job["full"]:
            weights = {k: p for k, p in weights.items() if k[2] == "fc2" and k[1] == depth - 1}
        stats = gradient_stats(model, criterion, samples, weights)
        rec = {"settings_key": key, "label": job["label"], "arch": arch, "depth": depth,
               "depth_requested": job["depth"], "seed": seed, "full": job["full"],
               "d": model.encoder.embed_tokens.embedding_dim,
               "normalize_before": bool(getattr(fargs, "encoder_normalize_before", False)),
               "tokens": [int(s["ntokens"]) for s in samples],
               "mean_grad": {}, "batch_norm": {}}
        for (stack, layer, w), (m, b) in sorted(stats.items()):
            rec["mean_grad"].setdefault(stack, {}).setdefault(w, [None] * depth)[layer] = m
            rec["batch_norm"].setdefault(stack, {}).setdefault(w, [None] * depth)[layer] = b
        if job["lemma2"]:
            rec["lemma2"] = lemma2_stats(model, samples[0])
        dt = time.time() - t0
        rec["seconds"] = round(dt, 2)
        with open(records_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        records.append(rec)
        spent_cost += cost
        spent_time += dt
        remaining = total_cost - spent_cost
        eta = spent_time / spent_cost * remaining
        last = {s: rec["mean_grad"][s]["fc2"][depth - 1] for s in ("encoder", "decoder")}
        print(f"[{i}/{len(jobs)}] {job['label']} depth {depth} seed {seed}: last-layer W2 grad norm "
              f"enc {last['encoder']:.3f} dec {last['decoder']:.3f} ({dt:.1f} s; elapsed "
              f"{fmt_time(time.time() - t_start)}, ETA {fmt_time(eta)})", flush=True)
        del model, criterion

    result = summarize.summarize(records, settings, args)
    result["seconds"] = round(time.time() - t_start, 1)
    result["cpu_seconds"] = round(time.process_time(), 1)
    tmp = out / "fig3.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out / "fig3.json")
    written = plots.plot_all(result, out)
    print(summarize.headline(result))
    print(f"wrote {out / 'fig3.json'}, {', '.join(str(p) for p in written)}")
    wall, cpu = time.time() - t_start, time.process_time()
    print(f"time taken: {fmt_time(wall)} ({wall:.0f} s wall, {cpu:.0f} s CPU over "
          f"{torch.get_num_threads()} threads)")
    return result


def _to(sample, device):
    from fairseq import utils

    return sample if device.type == "cpu" else utils.move_to_cuda(sample, device=device)


if __name__ == "__main__":
    main()
