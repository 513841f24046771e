"""Training diagnostics (``--log-diagnostics``): each value against a direct computation."""
import json
import math
import os

import pytest
import torch

from conftest import USER_DIR, fairseq_cmd, run
from fairseq_lnpos.diagnostics import (Diagnostics, attention_logits, attention_module_names, attention_stats,
                                       parse_updates, top_hessian_eigenvalue)
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.gradnorm import GradNormPlan
from test_gradnorm import NO_DROPOUT, TINY, _trainer


def _mha(seed=0, **kw):
    from fairseq.modules import MultiheadAttention

    torch.manual_seed(seed)
    m = MultiheadAttention(8, 2, **kw)
    for lin in (m.q_proj, m.k_proj):  # larger logits than the default init, so that the maximum is clear
        torch.nn.init.normal_(lin.weight, std=0.8)
        torch.nn.init.normal_(lin.bias, std=0.5)
    return m.eval()


def _explicit(m, x, key):
    """q k^T / sqrt(d) per head from the weights, by hand: (B, H, T, S)."""
    d = m.head_dim
    q = x @ m.q_proj.weight.T + m.q_proj.bias
    k = key @ m.k_proj.weight.T + m.k_proj.bias
    T, B, _ = q.shape
    S = k.shape[0]
    q = q.reshape(T, B, m.num_heads, d).permute(1, 2, 0, 3)
    k = k.reshape(S, B, m.num_heads, d).permute(1, 2, 0, 3)
    return torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d)


def test_max_logit_equals_explicit_qk_and_skips_padding():
    m = _mha(self_attention=True)
    x = torch.randn(5, 3, 8)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True  # sentence 2 has 3 tokens
    expected = _explicit(m, x, x)
    keep = ~pad.view(3, 1, 1, 5) & ~pad.view(3, 1, 5, 1)  # real keys of real queries
    with torch.no_grad():
        logits, valid = attention_logits(m, x, x, key_padding_mask=pad)
        stats = attention_stats(logits, valid, query_padding=pad)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert stats["max_logit"] == pytest.approx(float(expected[keep.expand_as(expected)].max()), rel=1e-5)
    # a padded key with the largest logit of all must not count
    x[4, 1] = 10 * x[0, 1]
    with torch.no_grad():
        logits, valid = attention_logits(m, x, x, key_padding_mask=pad)
        padded = attention_stats(logits, valid, query_padding=pad)
    explicit = _explicit(m, x, x)
    assert padded["max_logit"] == pytest.approx(float(explicit[keep.expand_as(explicit)].max()), rel=1e-5)
    assert padded["max_logit"] < float(explicit.max())


def test_entropy_equals_fairseqs_own_attention_weights_and_is_in_0_log_t():
    m = _mha(self_attention=True)
    m.skip_embed_dim_check = True  # fairseq's own (non-fused) path, which returns per-head weights
    T = 6
    x = torch.randn(T, 2, 8)
    future = torch.triu(torch.full((T, T), float("-inf")), 1)  # the decoder's causal mask
    with torch.no_grad():
        _, weights = m(x, x, x, attn_mask=future, need_head_weights=True)  # (H, B, T, S)
        logits, valid = attention_logits(m, x, x, attn_mask=future)
        stats = attention_stats(logits, valid)
    p = weights.permute(1, 0, 2, 3)
    entropy = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)  # (B, H, T)
    assert stats["rows"] == 2 * 2 * T
    assert stats["entropy_sum"] / stats["rows"] == pytest.approx(float(entropy.mean()), rel=1e-5)
    per_row = entropy
    keys = torch.arange(1, T + 1, dtype=torch.float32)  # query t sees t keys
    assert bool((per_row >= -1e-6).all()) and bool((per_row <= keys.log() + 1e-5).all())
    assert float(per_row[..., 0].abs().max()) < 1e-6  # the first query sees one key: entropy 0
    # the causal mask is applied: the largest logit is that of an allowed pair
    explicit = _explicit(m, x, x)
    allowed = torch.ones(T, T).tril().bool().expand_as(explicit)
    assert stats["max_logit"] == pytest.approx(float(explicit[allowed].max()), rel=1e-5)


def test_encoder_decoder_attention_uses_the_keys_and_their_padding():
    m = _mha(encoder_decoder_attention=True, kdim=8, vdim=8)
    q, mem = torch.randn(4, 2, 8), torch.randn(7, 2, 8)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    with torch.no_grad():
        logits, valid = attention_logits(m, q, mem, key_padding_mask=pad)
        stats = attention_stats(logits, valid)
    explicit = _explicit(m, q, mem)
    keep = (~pad).view(2, 1, 1, 7).expand_as(explicit)
    assert stats["max_logit"] == pytest.approx(float(explicit[keep].max()), rel=1e-5)
    assert stats["entropy_sum"] / stats["rows"] <= math.log(7) + 1e-6


def test_top_hessian_eigenvalue_of_a_quadratic():
    g = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(6, 6, generator=g))
    eig = torch.tensor([5.0, 1.0, 0.5, 0.2, -0.3, 0.1])
    a = basis @ torch.diag(eig) @ basis.T
    x = torch.nn.Parameter(torch.randn(6, generator=g))
    value = top_hessian_eigenvalue(0.5 * x @ a @ x, [x], iters=60)
    assert value == pytest.approx(5.0, rel=1e-3)
    assert x.grad is None


def test_update_ratio_adam_step_and_forward_stats_in_fairseqs_trainer(toy_data, tmp_path):
    trainer, task, batches = _trainer(toy_data, tmp_path, *NO_DROPOUT, "--log-diagnostics",
                                      "--diagnostics-interval", "1", "--diagnostics-hessian-updates", "2",
                                      "--diagnostics-hessian-iters", "3")
    diag = task.diagnostics
    assert isinstance(diag, Diagnostics)
    model = trainer.model
    for step in range(2):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        assert trainer.train_step([batches[step]]) is not None
        rec = diag.last
        assert rec["update"] == step + 1
        after = dict(model.named_parameters())
        for group, prefix in (("encoder/1/fc2", "encoder.layers.1.fc2."), ("decoder/0/encoder_attn",
                                                                           "decoder.layers.0.encoder_attn.")):
            names = [n for n in before if n.startswith(prefix)]
            dw = math.sqrt(sum(float((after[n].detach() - before[n]).pow(2).sum()) for n in names))
            w = math.sqrt(sum(float(before[n].pow(2).sum()) for n in names))
            assert rec["update_ratio"][group] == pytest.approx(dw / w, rel=1e-4)
        assert rec["update_ratio"]["total"] > 0
        # Adam's step size lr / (sqrt(v_hat) + eps) of one sub-layer, from the optimizer's state; weights
        # whose v is 0 (no gradient yet: dead ReLU units, unseen words) are left out
        opt = trainer.optimizer.optimizer
        grp = opt.param_groups[0]
        sizes = []
        for name in ("decoder.layers.1.fc1.weight", "decoder.layers.1.fc1.bias"):
            st = opt.state[after[name]]
            v_hat = st["exp_avg_sq"] / (1 - grp["betas"][1] ** float(st["step"]))
            sizes.append((grp["lr"] / (v_hat.sqrt() + grp["eps"]))[v_hat > 0])
        sizes = torch.cat(sizes)
        assert rec["adaptive_lr_max"]["decoder/1/fc1"] == pytest.approx(float(sizes.max()), rel=1e-4)
        assert float(sizes.min()) <= rec["adaptive_lr_median"]["decoder/1/fc1"] <= float(sizes.max())
        assert rec["adaptive_lr_median"]["decoder/1/fc1"] == pytest.approx(float(sizes.median()), rel=0.05)
        # every attention module of the model, in range
        names = {n for n, _ in attention_module_names(model)}
        assert names == {f"encoder/{i}/self_attn" for i in range(2)} | {
            f"decoder/{i}/{s}" for i in range(2) for s in ("self_attn", "encoder_attn")}
        assert names <= set(rec["attn_max_logit"]) and "decoder/1" in rec["attn_max_logit"]
        for name in names:
            assert 0 <= rec["attn_entropy_min_head"][name] <= rec["attn_entropy"][name] + 1e-9
        assert rec["output_logits"]["l2_mean"] > 0 and rec["output_logits"]["max_abs"] > 0
        assert ("hessian_top" in rec) == (step == 1)
    assert math.isfinite(rec["hessian_top"]) and rec["hessian_top"] != 0
    for m in model.modules():  # the hooks are gone after the step
        assert not m._forward_pre_hooks and not m._forward_hooks
    records = [json.loads(line) for line in (tmp_path / "diagnostics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [1, 2]
    # the figure of the gradient norms draws any metric of the file
    from fairseq_lnpos.analysis.train_curves import main, read_jsonl

    updates, series = read_jsonl(tmp_path / "diagnostics.jsonl", metric="hessian_top")
    assert updates == [2] and series == {"hessian_top": [rec["hessian_top"]]}
    updates, series = read_jsonl(tmp_path / "diagnostics.jsonl", metric="update_ratio")
    assert updates == [1, 2] and series["decoder/1"][1] == pytest.approx(rec["update_ratio"]["decoder/1"])
    for metric in ("update_ratio", "adaptive_lr_median", "attn_max_logit", "attn_entropy", "output_logits"):
        assert main([str(tmp_path / "diagnostics.jsonl"), "--metric", metric]) == 0
        assert (tmp_path / f"diagnostics_{metric}.png").read_bytes()[:4] == b"\x89PNG"


def test_output_logit_norm_equals_the_models_logits(toy_data, tmp_path):
    trainer, task, batches = _trainer(toy_data, tmp_path, *NO_DROPOUT, "--log-diagnostics",
                                      "--diagnostics-interval", "1")
    sample = trainer._prepare_sample(batches[0])[0]
    with torch.no_grad():
        trainer.model.train()
        logits = trainer.model(**sample["net_input"])[0]
    keep = sample["target"].ne(task.target_dictionary.pad())
    trainer.train_step([batches[0]])
    rec = task.diagnostics.last
    assert rec["output_logits"]["l2_mean"] == pytest.approx(float(logits.norm(dim=-1)[keep].mean()), rel=1e-5)
    assert rec["output_logits"]["max_abs"] == pytest.approx(float(logits.abs().max()), rel=1e-5)


def test_off_by_default_no_hooks_no_file(toy_data, tmp_path):
    trainer, task, batches = _trainer(toy_data, tmp_path)
    assert task.diagnostics is None
    trainer.train_step([batches[0]])
    assert not (tmp_path / "diagnostics.jsonl").exists()
    for m in trainer.model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks


def test_interval_and_first_updates():
    d = Diagnostics(interval=5, first=2, hessian_updates=(7,))
    assert [u + 1 for u in range(12) if d.is_logging_update(u)] == [1, 2, 5, 7, 10]


def test_bad_options_are_one_line_errors():
    with pytest.raises(LnposError, match="--diagnostics-interval must be at least 1"):
        Diagnostics(interval=-1)
    with pytest.raises(LnposError, match="--diagnostics-hessian-updates 1,x: give comma-separated update numbers"):
        parse_updates("1,x")
    assert parse_updates("200, 1,50") == (1, 50, 200)


def test_group_norms_of_arbitrary_tensors_match_the_gradient_path():
    lin = torch.nn.Linear(3, 2)
    plan = GradNormPlan(lin)
    for p in lin.parameters():
        p.grad = torch.randn_like(p)
    assert torch.allclose(plan.norms_of([p.grad for p in plan.params]), plan.tensor_norms())


@pytest.mark.slow
def test_fairseq_train_writes_diagnostics_and_a_short_log_line(toy_data, tmp_path):
    save = tmp_path / "ckpt"
    result = run(fairseq_cmd(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--task", "translation_lnpos", "--log-diagnostics",
        "--log-grad-norms", "--arch", "transformer", *TINY, "--optimizer", "adam", "--lr", "1e-3",
        "--max-tokens", 300, "--max-update", 4, "--log-interval", 2, "--log-format", "simple", "--cpu", "--no-save",
        "--save-dir", save, "--disable-validation", "--num-workers", 0,
    ), env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (save / "diagnostics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [2, 4]
    assert records[1]["update_s"] > 0 and records[1]["overhead_s"] > 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "train_inner" in line]
    assert lines and all("diag/update_ratio_max=" in line and "diag/attn_logit_max=" in line for line in lines)
    assert all(len(line) < 500 for line in lines), max(map(len, lines))


def test_a_group_that_starts_at_zero_has_no_update_ratio():
    """||dW|| / ||W|| is undefined for weights that are all 0 (Admin's deltas before their first update)."""
    model = torch.nn.Module()
    model.encoder = torch.nn.Module()
    model.encoder.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.encoder.layers[0].fc1 = torch.nn.Linear(3, 2)
    model.encoder.layers[0].delta = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sum(p.sum() for p in model.parameters()).backward()
    diag = Diagnostics(interval=1)
    diag._bind(model)
    before = [p.detach().clone() for p in diag.plan.params]
    opt.step()
    ratio = diag.measure(opt, before)["update_ratio"]
    assert ratio["encoder/0/delta"] is None
    fc1 = model.encoder.layers[0].fc1
    old = dict(zip(diag.plan.names, before))
    w = math.hypot(float(old["encoder.layers.0.fc1.weight"].norm()), float(old["encoder.layers.0.fc1.bias"].norm()))
    assert ratio["encoder/0/fc1"] == pytest.approx(0.1 * math.sqrt(fc1.weight.numel() + fc1.bias.numel()) / w, rel=1e-5)


def test_micro_batches_of_an_update_are_pooled():
    """--update-freq: the largest logit over the micro-batches, the entropy averaged over all their rows."""
    from fairseq_lnpos.diagnostics import _AttentionAccumulator

    m = _mha(self_attention=True)
    a, b = torch.randn(4, 2, 8), 3 * torch.randn(6, 3, 8)
    acc = _AttentionAccumulator()
    with torch.no_grad():
        parts = [attention_stats(*attention_logits(m, x, x)) for x in (a, b)]
        both = [attention_logits(m, x, x) for x in (a, b)]
    for s in parts:
        acc.add(s)
    max_logit, entropy, entropy_min = acc.result()
    assert max_logit == max(float(lg.max()) for lg, _ in both)
    rows = sum(s["rows"] for s in parts)
    assert rows == 2 * 4 * 2 + 3 * 6 * 2
    assert entropy == pytest.approx(sum(s["entropy_sum"] for s in parts) / rows)
    per_head = (parts[0]["head_entropy_sum"] + parts[1]["head_entropy_sum"]) / (parts[0]["head_rows"] + parts[1]["head_rows"])
    assert entropy_min == pytest.approx(float(per_head.min())) and entropy_min <= entropy


@pytest.mark.parametrize("arch", ["transformer", "transformer_deepnorm", "transformer_b2t", "transformer_rezero"])
def test_residual_ratio_is_the_sublayer_over_the_skip_term(toy_data, tmp_path, arch):
    """||F(x)|| / ||s x|| of a connection against the sublayer's output and the layer's input, hooked
    independently: s = 1 for Post-LN and B2T's attention, DeepNorm's alpha, and ReZero's branch a F(x) = 0 at
    initialization."""
    from fairseq_lnpos.models.deepnorm import deepnorm_coefficients

    trainer, task, batches = _trainer(toy_data, tmp_path, *NO_DROPOUT, "--arch", arch, "--log-diagnostics",
                                      "--diagnostics-interval", "1")
    layer = trainer.model.encoder.layers[1]
    seen = {}
    def keep(key, value):  # a hook that returns nothing changes nothing
        seen.setdefault(key, value.detach().clone())

    handles = [layer.register_forward_pre_hook(lambda m, args: keep("input", args[0])),
               layer.self_attn.register_forward_hook(lambda m, args, out: keep("attn", out[0]))]
    trainer.train_step([batches[0]])
    for h in handles:
        h.remove()
    ratio = task.diagnostics.last["residual_ratio"]
    assert set(ratio) == {f"{side}/{i}{sub}" for side, subs in (("encoder", ("self_attn", "ffn")),
                                                                ("decoder", ("self_attn", "encoder_attn", "ffn")))
                          for i in range(2) for sub in ("", *(f"/{s}" for s in subs))}
    if arch == "transformer_rezero":
        assert all(v == 0 for v in ratio.values())  # a = 0: no sublayer adds anything yet
    else:
        skip = deepnorm_coefficients(2, 2)["encoder"][0] if arch == "transformer_deepnorm" else 1.0
        assert ratio["encoder/1/self_attn"] == pytest.approx(
            float(seen["attn"].norm()) / (skip * float(seen["input"].norm())), rel=1e-5)
        assert 0 < ratio["encoder/1/ffn"] and min(ratio["encoder/1/self_attn"], ratio["encoder/1/ffn"]) <= \
            ratio["encoder/1"] <= max(ratio["encoder/1/self_attn"], ratio["encoder/1/ffn"])
    for m in trainer.model.modules():  # the measuring connection and its hooks are gone after the step
        assert not m._forward_pre_hooks and not m._forward_hooks and "residual_connection" not in vars(m)
