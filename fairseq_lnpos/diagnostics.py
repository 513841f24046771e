"""Training diagnostics that tell the explanations of warm-up apart (``--log-diagnostics``).

Written by the ``translation_lnpos`` task to ``<save-dir>/diagnostics.jsonl``, one record per
logged update; groups are those of :mod:`fairseq_lnpos.gradnorm` (``encoder/3/fc2``,
``decoder/5``, ``total`` ...). What each measures, and which explanation it tests:

- ``update_ratio``: ||W_after - W_before|| / ||W_before|| of the update, per group: the relative
  (angular) size of the first updates (Kosson et al. 2024). Taken around fairseq's
  ``task.optimizer_step``, so it is the step the optimizer took (after clipping, lr schedule, weight
  decay); ``null`` for a group whose weights are all 0 before the update (Admin's deltas at first).
  The log line's ``diag/update_ratio_max`` is the largest of the whole layers (``encoder/3``).
- ``adaptive_lr_median``, ``adaptive_lr_p99``, ``adaptive_lr_max``: percentiles of Adam's
  per-weight step size lr / (sqrt(v_hat) + eps), v_hat = v / (1 - beta2^t), over each sub-layer's
  weights after the update (from at most 1024 evenly strided weights of each tensor, as a full sort
  per sub-layer would cost more than the update; the maximum from all weights;
  weights whose v is still 0, e.g. the embeddings of words not seen yet,
  are left out): how large Adam's early second-moment estimate lets the steps be
  (RAdam's argument; Ma & Yarats 2021). For any optimizer whose state has ``exp_avg_sq`` (adam,
  radam, giadam) and whose state is kept per model parameter (fp32 training; under fairseq's fp16
  optimizers the state belongs to the fp32 copies and these keys are left out).
- ``attn_max_logit``, ``attn_entropy``, ``attn_entropy_min_head``: per attention module (and per
  layer, ``encoder/3`` = the largest logit / the mean entropy of that layer's attention modules),
  the largest attention logit q.k / sqrt(d_head) over the unmasked (query, key) pairs of the
  update's batches (attention-logit growth, Wortsman et al. 2023), the mean entropy of the attention
  distributions (nats; at most log of the number of keys a query sees) and the smallest per-head
  mean. fairseq's ``MultiheadAttention`` computes the logits inside
  ``F.multi_head_attention_forward`` where no hook sees them, so a forward pre-hook takes the
  module's inputs and recomputes q = q_proj(x) / sqrt(d_head), k = k_proj(x) and q k^T with the
  module's own projections and masks (``attn_mask``, ``key_padding_mask``), without gradients;
  padded query positions of a self-attention are left out.
- ``output_logits``: ``l2_mean``, the mean over non-padding target tokens of the L2 norm of the
  output logit vector, and ``max_abs``, the largest logit (amplified output change, Admin's view).
- ``residual_ratio``: per residual connection (``encoder/3/self_attn``, ``decoder/3/encoder_attn``,
  ``encoder/3/ffn``; per layer, ``encoder/3``, all its connections pooled), the norm of what the
  sublayer adds to the residual sum over the norm of what the skip path adds, ||F(x)|| / ||s x||,
  pooled over the update's micro-batches (square roots of summed squares over every position,
  padding included). Taken around the layer's ``residual_connection(x, residual)``, which every
  variant's layer calls once per sublayer: F(x) is the ``x`` it is given (the sublayer's output
  after dropout) and s x is the connection's result minus it, so DeepNorm's alpha x, Admin's omega x
  and B2T's extra layer input count as skip; for ReZero, whose connection scales the branch
  (``residual + a F(x)``), F(x) is ``a x``. A small ratio is a sublayer whose updates barely move
  the stream (a slow start); a large one, a stream the sublayers overwrite.
- ``hessian_top`` (only at the updates of ``--diagnostics-hessian-updates``): the top eigenvalue
  of the Hessian of the update's first batch's loss (mean per token, as fairseq's gradient), by
  power iteration with Hessian-vector products (double backward): the sharpness of Kalra &
  Barkeshli 2024. Cost: one forward and backward with graph, then ``--diagnostics-hessian-iters``
  Hessian-vector products of about two backward passes each; tiny models only.
- ``update_s``: seconds from the end of the previous optimizer step to the end of this one (the
  update, the diagnostics included); ``prev_update_s``: the same of the previous update;
  ``overhead_s``: the seconds spent in the diagnostics during this update. Their ratio is the cost.

On updates that are not logged the task compares two integers; with the option off nothing of this
module runs.
"""
import inspect
import json
import math
import os
import time
from collections import OrderedDict

import torch

from .common import open_log
from .errors import check
from .gradnorm import LAYER_GROUP, GradNormPlan, finite_or_none, groups_of
from .models.sublayers import sublayer_names

TAG_PREFIX = "diag/"
PERCENTILES = (("median", 0.5), ("p99", 0.99))
QUANTILE_SAMPLE = 1024  # weights per tensor the percentiles are taken from (the maximum uses all)


def parse_updates(text, option="--diagnostics-hessian-updates"):
    """``"1,10,100"`` -> ``(1, 10, 100)``; empty -> ``()``."""
    if not text:
        return ()
    try:
        updates = tuple(sorted({int(x) for x in str(text).split(",") if x.strip()}))
    except ValueError:
        updates = None
    check(updates is not None and all(u >= 1 for u in updates),
          f"{option} {text}: give comma-separated update numbers of at least 1, e.g. 1,50,200")
    return updates


# ------------------------------------------------------------------------------------- attention

def attention_module_names(model):
    """``[(group name, MultiheadAttention module)]``, e.g. ``("decoder/1/encoder_attn", m)``."""
    from fairseq.modules import MultiheadAttention

    return [(groups_of(f"{name}.weight")[0], m) for name, m in model.named_modules()
            if isinstance(m, MultiheadAttention)]


def attention_logits(module, query, key, key_padding_mask=None, attn_mask=None):
    """``(logits, valid)`` of a fairseq ``MultiheadAttention`` for time-first inputs: logits
    q k^T / sqrt(d_head) of shape (batch, heads, T, S), ``valid`` a bool tensor of the same shape,
    False where a mask removes the pair."""
    if module.self_attention:
        key = query
    tgt_len, bsz, _ = query.shape
    src_len = key.shape[0]
    heads, head_dim = module.num_heads, module.head_dim
    q = (module.q_proj(query) * module.scaling).view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    k = module.k_proj(key).view(src_len, bsz, heads, head_dim).permute(1, 2, 3, 0)
    logits = torch.matmul(q.float(), k.float())
    valid = torch.ones_like(logits, dtype=torch.bool)
    if attn_mask is not None:
        if attn_mask.is_floating_point():  # additive: -inf (the decoder's future mask) or fairseq's -1e8 fill
            blocked = attn_mask <= -1e8
            logits = logits + attn_mask.float().masked_fill(blocked, 0.0)
        else:
            blocked = attn_mask.to(torch.bool)
        valid = valid & ~blocked.view(1, 1, tgt_len, src_len)
    if key_padding_mask is not None:
        valid = valid & ~key_padding_mask.to(torch.bool).view(bsz, 1, 1, src_len)
    return logits, valid


def attention_stats(logits, valid, query_padding=None):
    """Largest logit, summed entropy, number of rows and per-head entropy sums over the rows (query
    positions) that have at least one key; ``query_padding`` (batch, T) drops padded queries."""
    rows = valid.any(-1)  # (B, H, T)
    if query_padding is not None:
        rows = rows & ~query_padding.to(torch.bool).view(query_padding.shape[0], 1, -1)
    masked = logits.masked_fill(~valid, float("-inf"))
    logp = torch.log_softmax(masked.masked_fill(~rows.unsqueeze(-1), 0.0), dim=-1)
    p = logp.exp()
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)  # (B, H, T)
    entropy = entropy.masked_fill(~rows, 0.0)
    in_rows = valid & rows.unsqueeze(-1)
    max_logit = logits.masked_fill(~in_rows, float("-inf")).max()
    return {"max_logit": float(max_logit), "entropy_sum": float(entropy.sum()), "rows": int(rows.sum()),
            "head_entropy_sum": entropy.sum(dim=(0, 2)).double(), "head_rows": rows.sum(dim=(0, 2)).double()}


class _AttentionAccumulator:
    """Sums of one module's statistics over the micro-batches of an update."""

    def __init__(self):
        self.max_logit, self.entropy_sum, self.rows = -math.inf, 0.0, 0
        self.head_entropy_sum = self.head_rows = None

    def add(self, s):
        self.max_logit = max(self.max_logit, s["max_logit"])
        self.entropy_sum += s["entropy_sum"]
        self.rows += s["rows"]
        if self.head_rows is None:
            self.head_entropy_sum, self.head_rows = s["head_entropy_sum"], s["head_rows"]
        else:
            self.head_entropy_sum = self.head_entropy_sum + s["head_entropy_sum"]
            self.head_rows = self.head_rows + s["head_rows"]

    def result(self):
        if not self.rows:
            return None
        per_head = self.head_entropy_sum / self.head_rows.clamp(min=1)
        return self.max_logit, self.entropy_sum / self.rows, float(per_head.min())


# --------------------------------------------------------------------------------------- Hessian

def top_hessian_eigenvalue(loss, params, iters=20, seed=0):
    """The eigenvalue of largest magnitude of the Hessian of ``loss`` (a scalar with its graph)
    with respect to ``params``, by ``iters`` steps of power iteration on Hessian-vector products;
    the Rayleigh quotient v.Hv of the last vector. Leaves ``.grad`` untouched."""
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    params, grads = zip(*[(p, g) for p, g in zip(params, grads) if g is not None])
    gen = torch.Generator().manual_seed(seed)
    v = [torch.randn(p.shape, generator=gen).to(p) for p in params]
    norm = torch.sqrt(sum((x * x).sum() for x in v))
    v = [x / norm for x in v]
    value = 0.0
    for _ in range(iters):
        hv = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
        value = float(sum((a * b).sum() for a, b in zip(v, hv)))
        norm = torch.sqrt(sum((x * x).sum() for x in hv))
        if not torch.isfinite(norm) or float(norm) == 0.0:
            break
        v = [x / norm for x in hv]
    return value


def _math_attention():
    """The math kernel of scaled_dot_product_attention (twice differentiable); a no-op context on a
    torch without ``torch.nn.attention``."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.MATH)
    except ImportError:  # pragma: no cover - older torch
        import contextlib
        return contextlib.nullcontext()


# ------------------------------------------------------------------------------------- the logger

def _quantiles(values, qs):
    """Nearest-rank quantiles ``qs`` of a 1-d tensor."""
    n = values.numel()
    return [float(values.float().kthvalue(min(n, max(1, round(q * (n - 1)) + 1))).values) for q in qs]


def residual_layers(model):
    """(``encoder/3``, layer) of every Transformer layer of ``model`` (fairseq's ``encoder.layers``,
    ``decoder.layers``)."""
    return [(f"{side}/{i}", layer) for side in ("encoder", "decoder")
            for i, layer in enumerate(getattr(getattr(model, side, None), "layers", None) or [])]


def residual_record(sums):
    """``residual_ratio`` of {"encoder/3/ffn": [sum ||F||^2, sum ||s x||^2]}: per connection, then per
    layer with its connections pooled; None where the skip added nothing."""
    layers = OrderedDict()
    for key, (b, k) in sums.items():
        acc = layers.setdefault(key.rsplit("/", 1)[0], [0.0, 0.0])
        acc[0], acc[1] = acc[0] + b, acc[1] + k
    ratio = lambda b, k: finite_or_none(math.sqrt(b / k)) if k > 0 else None  # noqa: E731
    return OrderedDict([*((key, ratio(*v)) for key, v in sums.items()), *((key, ratio(*v)) for key, v in layers.items())])


class Diagnostics:
    """Hooks of the ``translation_lnpos`` task: :meth:`train_step` around each micro-batch,
    :meth:`optimizer_step` around fairseq's optimizer step."""

    def __init__(self, interval, first=0, hessian_updates=(), hessian_iters=20, jsonl_path=None):
        check(interval >= 1, f"--diagnostics-interval must be at least 1 (got {interval}); 0 means --log-interval")
        check(first >= 0, f"--diagnostics-first must be at least 0 (got {first})")
        check(hessian_iters >= 1, f"--diagnostics-hessian-iters must be at least 1 (got {hessian_iters})")
        self.interval, self.first = interval, first
        self.hessian_updates, self.hessian_iters = set(hessian_updates), hessian_iters
        self.jsonl_path = jsonl_path
        self.model = self.plan = self.attention = None
        self.leaf = []  # per parameter of the plan: its sub-layer group (Adam's step sizes are per sub-layer)
        self.pending_update = None  # the update whose forward statistics are being gathered
        self.attn, self.logits, self.extra = {}, None, {}
        self.residual = {}  # "encoder/3/ffn" -> [sum ||F(x)||^2, sum ||s x||^2] of the logged update
        self.overhead = 0.0
        self.last_step_end = self.prev_update_s = None
        self.last = None  # the last record written

    def is_logging_update(self, update_num):
        """``update_num``: fairseq's counter before the update (the update is ``update_num + 1``)."""
        u = update_num + 1
        return u <= self.first or u % self.interval == 0 or u in self.hessian_updates

    def _bind(self, model):
        if model is not self.model:
            self.model, self.plan = model, GradNormPlan(model)
            self.attention = attention_module_names(model)
            self.leaf = [groups_of(n)[0] for n in self.plan.names]

    def _start(self, update_num):
        if self.pending_update != update_num:
            self.pending_update, self.attn, self.logits, self.extra, self.overhead = update_num, {}, None, {}, 0.0
            self.residual = {}

    # ---- forward statistics, on every micro-batch of a logged update
    def train_step(self, sample, model, criterion, update_num, run):
        """Run ``run()`` (the task's train step) with the forward hooks installed on logged updates."""
        if not self.is_logging_update(update_num):
            return run()
        t0 = time.perf_counter()
        self._bind(model)
        self._start(update_num)
        if update_num + 1 in self.hessian_updates and "hessian_top" not in self.extra:
            self.extra["hessian_top"] = self.hessian(sample, model, criterion)
            self.extra["hessian_s"] = round(time.perf_counter() - t0, 3)
        handles = [m.register_forward_pre_hook(self._attention_hook(name), with_kwargs=True)
                   for name, m in self.attention]
        target = sample.get("target") if isinstance(sample, dict) else None
        pad = getattr(criterion, "padding_idx", None)
        handles.append(model.register_forward_hook(self._logits_hook(target, pad)))
        wrapped = [(layer, self._wrap_residual(layer, name)) for name, layer in residual_layers(model)]
        self.overhead += time.perf_counter() - t0
        try:
            return run()
        finally:
            for h in handles:
                h.remove()
            for layer, h in wrapped:
                h.remove()
                del layer.residual_connection  # the class's method again

    def _wrap_residual(self, layer, name):
        """Shadow ``layer.residual_connection`` with one that measures it (see ``residual_ratio``);
        returns the forward pre-hook that numbers the layer's connections in each forward."""
        original, names, calls = layer.residual_connection, sublayer_names(layer), [0]

        def start(module, args):
            calls[0] = 0

        def residual_connection(x, residual):
            out = original(x, residual)
            t0 = time.perf_counter()
            with torch.no_grad():
                branch = x * layer.rezero_weight if hasattr(layer, "rezero_weight") else x
                if calls[0] >= len(names):  # the contract of models/sublayers.py: once per sublayer
                    raise RuntimeError(f"{name} ({type(layer).__name__}) called residual_connection more often than "
                                       f"it has sublayers ({', '.join(names)}): residual_ratio cannot name the call")
                sums = self.residual.setdefault(f"{name}/{names[calls[0]]}", [0.0, 0.0])
                sums[0] += float(branch.detach().float().pow(2).sum())
                sums[1] += float((out.detach() - branch.detach()).float().pow(2).sum())
            calls[0] += 1
            self.overhead += time.perf_counter() - t0
            return out

        layer.residual_connection = residual_connection
        return layer.register_forward_pre_hook(start)

    def _attention_hook(self, name):
        def hook(module, args, kwargs):
            t0 = time.perf_counter()
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            a = bound.arguments
            if a.get("incremental_state") is None and module.bias_k is None and not module.add_zero_attn:
                with torch.no_grad():
                    logits, valid = attention_logits(module, a["query"], a.get("key"), a.get("key_padding_mask"),
                                                     a.get("attn_mask"))
                    self_pad = a.get("key_padding_mask") if (module.self_attention or a.get("key") is a["query"]) else None
                    self.attn.setdefault(name, _AttentionAccumulator()).add(attention_stats(logits, valid, self_pad))
            self.overhead += time.perf_counter() - t0
        return hook

    def _logits_hook(self, target, pad):
        def hook(module, args, output):
            t0 = time.perf_counter()
            logits = output[0] if isinstance(output, (tuple, list)) else output
            if torch.is_tensor(logits) and logits.dim() == 3:
                with torch.no_grad():
                    norms = logits.detach().float().norm(dim=-1)
                    keep = target.ne(pad) if target is not None and pad is not None and target.shape == norms.shape \
                        else torch.ones_like(norms, dtype=torch.bool)
                    s = (float(norms[keep].sum()), int(keep.sum()), float(logits.detach().abs().max()))
                    old = self.logits or (0.0, 0, 0.0)
                    self.logits = (old[0] + s[0], old[1] + s[1], max(old[2], s[2]))
            self.overhead += time.perf_counter() - t0
        return hook

    def hessian(self, sample, model, criterion):
        """Top Hessian eigenvalue of the mean per-token loss of ``sample`` (the module's text)."""
        with _math_attention():
            loss, sample_size, _ = criterion(model, sample)
            return finite_or_none(top_hessian_eigenvalue(loss / max(float(sample_size), 1.0), self.plan.params,
                                                         self.hessian_iters))

    # ---- the update itself
    def optimizer_step(self, optimizer, model, update_num, step):
        """Run ``step()`` (fairseq's optimizer step); on logged updates measure it and write the record."""
        if not self.is_logging_update(update_num):
            step()
            self._step_timing()
            return
        t0 = time.perf_counter()
        self._bind(model)
        self._start(update_num)
        before = [p.detach().clone() for p in self.plan.params]
        self.overhead += time.perf_counter() - t0
        step()
        t1 = time.perf_counter()
        rec = self.measure(optimizer, before)
        self.overhead += time.perf_counter() - t1
        update_s, prev = self._step_timing()
        rec.update(update_s=update_s, prev_update_s=prev, overhead_s=round(self.overhead, 6))
        self.write(rec, update_num, optimizer)
        self.pending_update = None

    def _step_timing(self):
        now = time.perf_counter()
        update_s = None if self.last_step_end is None else now - self.last_step_end
        prev, self.prev_update_s, self.last_step_end = self.prev_update_s, update_s, now
        return update_s, prev

    def measure(self, optimizer, before):
        plan = self.plan
        with torch.no_grad():
            after = [p.detach() for p in plan.params]
            diff = plan.norms_of([a - b for a, b in zip(after, before)])
            weight = plan.norms_of(before)
        weight = plan.group_norms(weight)
        ratio = plan.group_norms(diff) / weight.clamp(min=1e-30)
        rec = OrderedDict(update_ratio=OrderedDict(  # a group that starts at 0 (Admin's deltas) has none
            (g, finite_or_none(r) if w > 0 else None) for g, r, w in zip(plan.groups, ratio.tolist(), weight.tolist())))
        rec.update(self.adaptive_lr(optimizer))
        if self.attn:
            rec.update(self.attention_record())
        if self.residual:
            rec["residual_ratio"] = residual_record(self.residual)
        if self.logits is not None and self.logits[1]:
            rec["output_logits"] = {"l2_mean": self.logits[0] / self.logits[1], "max_abs": self.logits[2]}
        rec.update(self.extra)
        return rec

    def adaptive_lr(self, optimizer):
        """Percentiles of lr / (sqrt(v_hat) + eps) per sub-layer; {} when the optimizer has no
        per-parameter ``exp_avg_sq``."""
        torch_opt = getattr(optimizer, "optimizer", optimizer)
        state, groups = getattr(torch_opt, "state", {}), getattr(torch_opt, "param_groups", [])
        group_of = {id(p): g for g in groups for p in g["params"]}
        by_leaf = OrderedDict()  # leaf -> ([sampled lr / (sqrt(v_hat) + eps)], smallest v_hat > 0)
        for p, leaf in zip(self.plan.params, self.leaf):
            st, g = state.get(p), group_of.get(id(p))
            if not st or g is None or "exp_avg_sq" not in st or "step" not in st or "betas" not in g:
                continue
            v = st["exp_avg_sq"].detach().flatten()
            correction = 1 - g["betas"][1] ** float(st["step"])
            sample = v[:: math.ceil(v.numel() / QUANTILE_SAMPLE)].float() / correction
            sample = sample[sample > 0]  # weights that never had a gradient (unseen words' embeddings) do not move
            if not sample.numel():
                continue
            smallest = float(v.masked_fill(v <= 0, float("inf")).min()) / correction
            parts, largest = by_leaf.setdefault(leaf, ([], 0.0))
            parts.append(g["lr"] / (sample.sqrt() + g["eps"]))
            by_leaf[leaf] = (parts, max(largest, g["lr"] / (math.sqrt(smallest) + g["eps"])))
        if not by_leaf:
            return {}
        out = OrderedDict((f"adaptive_lr_{k}", OrderedDict()) for k, _ in PERCENTILES + (("max", 1.0),))
        for leaf, (parts, largest) in by_leaf.items():
            for (k, _), q in zip(PERCENTILES, _quantiles(torch.cat(parts), [q for _, q in PERCENTILES])):
                out[f"adaptive_lr_{k}"][leaf] = finite_or_none(q)
            out["adaptive_lr_max"][leaf] = finite_or_none(largest)
        return out

    def attention_record(self):
        max_logit, entropy, entropy_min = OrderedDict(), OrderedDict(), OrderedDict()
        layers = OrderedDict()
        for name, _ in self.attention:
            res = self.attn.get(name) and self.attn[name].result()
            if res is None:
                continue
            max_logit[name], entropy[name], entropy_min[name] = (finite_or_none(x) for x in res)
            layers.setdefault(name.rsplit("/", 1)[0], []).append(res)
        for layer, results in layers.items():  # per layer: the largest logit, the mean entropy
            max_logit[layer] = finite_or_none(max(r[0] for r in results))
            entropy[layer] = finite_or_none(sum(r[1] for r in results) / len(results))
        return {"attn_max_logit": max_logit, "attn_entropy": entropy, "attn_entropy_min_head": entropy_min}

    def write(self, rec, update_num, optimizer):
        from fairseq import metrics

        rec = OrderedDict([("update", update_num + 1), ("time", round(time.time(), 3))], **rec)
        try:
            rec["lr"] = optimizer.get_lr()
        except Exception:  # an optimizer without param groups yet
            pass
        self.last = rec
        ratios = [v for g, v in rec["update_ratio"].items() if v is not None and LAYER_GROUP.match(g)]
        if ratios:  # of whole layers, as gnorm/layer_max
            metrics.log_scalar(TAG_PREFIX + "update_ratio_max", max(ratios), weight=1, priority=1100, round=None)
        logits = [v for v in rec.get("attn_max_logit", {}).values() if v is not None]
        if logits:
            metrics.log_scalar(TAG_PREFIX + "attn_logit_max", max(logits), weight=1, priority=1101, round=None)
        if self.jsonl_path is None:
            return
        os.makedirs(os.path.dirname(self.jsonl_path) or ".", exist_ok=True)
        with open_log(self.jsonl_path) as f:
            f.write(json.dumps(rec) + "\n")
