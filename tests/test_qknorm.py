"""QK-norm (``--lnpos-qk-norm``): the attention computed from its formula in plain torch, in training
mode (where fairseq would take torch's fused attention), in eval mode and step by step with the
keys cached normalised; l2's scale; every variant; the errors; fairseq-train and -generate.

The plain-torch functions here (norms, attention, FFN) also serve the variants' formula tests."""
import math
import re

import pytest
import torch

from conftest import USER_DIR, build_model, fairseq_cmd, run, same_state, toy_data, two_layers  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.models.qknorm import DEFAULT_QK_LENGTH, QKNormalization
from fairseq_lnpos.variants import VARIANTS, arch_name
from helpers import decode_both_ways, generated_bleu

# float64 throughout, but fairseq's attention takes its softmax in float32 (fairseq.utils.softmax)
TOL = 1e-6
NO_DROPOUT = ("--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0)
SMALL = ("--encoder-layers", 2, "--decoder-layers", 2)


# ---- the formulas in plain torch (float64 in the tests) ----

def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def ln(module, x):
    """``x`` through the formula of the LayerNorm ``module`` (its weight, bias and eps)."""
    return layer_norm(x, module.weight, module.bias, module.eps)


def rms_norm(x, w, eps=1e-5):
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * w


def l2_normalize(x):
    return x / torch.sqrt((x ** 2).sum(-1, keepdim=True))


def linear(module, x):
    return x @ module.weight.T + module.bias


def ffn(layer, x):
    """fc2(relu(fc1(x))), fairseq's default activation."""
    return linear(layer.fc2, torch.relu(linear(layer.fc1, x)))


def qk_norm(kind, scope, heads, norm, x):
    """The QK-norm ``kind`` of ``x`` (T x B x C) per head or over the full width, ``norm`` the
    module holding its weight (and bias)."""
    groups = heads if scope == "head" else 1
    h = x.reshape(*x.shape[:-1], groups, -1)
    if kind == "layernorm":
        h = layer_norm(h, norm.weight, norm.bias)
    elif kind == "rmsnorm":
        h = rms_norm(h, norm.weight)
    else:
        h = l2_normalize(h)
    return h.reshape(x.shape)


def attention(attn, query, key, mask=None, qk=None, values=False):
    """fairseq's MultiheadAttention (no dropout) from its formula: softmax(s q k^T + mask) v, then
    out_proj; ``qk``: ``(kind, scope)`` of a QK-norm (q, k, with ``values`` v too, normalised after
    their projection; ``s`` = g for l2, else 1/sqrt(d_head))."""
    heads, d_head = attn.num_heads, attn.head_dim
    q, k, v = linear(attn.q_proj, query), linear(attn.k_proj, key), linear(attn.v_proj, key)
    scale = d_head ** -0.5
    if qk is not None:
        kind, scope = qk
        q = qk_norm(kind, scope, heads, attn.qk_norm.q, q)
        k = qk_norm(kind, scope, heads, attn.qk_norm.k, k)
        if values:
            v = qk_norm(kind, scope, heads, attn.qk_norm.v, v)
        if kind == "l2":
            scale = attn.qk_norm.scale
    split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, d_head).permute(1, 2, 0, 3)  # noqa: E731  B H T d
    logits = scale * split(q) @ split(k).transpose(-1, -2)
    if mask is not None:
        logits = logits + mask
    out = torch.softmax(logits, -1) @ split(v)  # B H T d
    return linear(attn.out_proj, out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1))


def causal(n):
    return torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1)


def randomize_qk_norms(model, seed=0):
    """The QK-norms' weights and biases random (each head's slice would fail a formula that forgets the
    norm is shared by the heads, a wrong slice or a missing bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".qk_norm." in name and not name.endswith("scale"):
                p.copy_((1 if name.endswith("weight") else 0) + 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def qk_model(toy_data, kind, scope="head", arch="transformer_postln_tiny", *extra):
    model, task, args = build_model(toy_data, arch, *SMALL, *NO_DROPOUT, "--lnpos-qk-norm", kind,
                                    "--lnpos-qk-norm-scope", scope, *extra)
    model.double()
    randomize_qk_norms(model)
    return model, task, args


FORMS = [(kind, scope) for kind in ("layernorm", "rmsnorm", "l2") for scope in ("head", "width")]


@pytest.mark.parametrize("kind,scope", FORMS)
def test_every_attention_is_the_formula_in_training_and_in_eval_mode(toy_data, kind, scope):
    model, _, _ = qk_model(toy_data, kind, scope)
    enc, dec = model.encoder.layers[1], model.decoder.layers[0]
    g = torch.Generator().manual_seed(3)
    x, y, memory = (torch.randn(n, 2, 128, generator=g, dtype=torch.float64) for n in (7, 5, 7))
    for mode in ("train", "eval"):  # train: fairseq would run torch's fused attention, skipping the projections' hooks
        model.train(mode == "train")
        with torch.no_grad():
            got = [enc.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False)[0],
                   dec.self_attn(query=y, key=y, value=y, key_padding_mask=None, need_weights=False,
                                 attn_mask=causal(5))[0],
                   dec.encoder_attn(query=y, key=memory, value=memory, key_padding_mask=None, static_kv=True,
                                    need_weights=False)[0],
                   enc(x, encoder_padding_mask=None)]
        expected = [attention(enc.self_attn, x, x, qk=(kind, scope)),
                    attention(dec.self_attn, y, y, causal(5), qk=(kind, scope)),
                    attention(dec.encoder_attn, y, memory, qk=(kind, scope))]
        h = ln(enc.self_attn_layer_norm, x + expected[0])  # the Post-LN layer uses it
        expected.append(ln(enc.final_layer_norm, h + ffn(enc, h)))
        for a, b in zip(got, expected):
            assert torch.allclose(a, b, atol=TOL), (mode, (a - b).abs().max())
    # and it is not the attention without the norm
    plain = attention(enc.self_attn, x, x)
    assert (plain - expected[0]).abs().max() > 1e-2


@pytest.mark.parametrize("kind,scope", [("layernorm", "head"), ("layernorm", "width"), ("rmsnorm", "head"),
                                        ("l2", "head")])
def test_keys_are_cached_normalised_and_incremental_decoding_equals_the_full_forward(toy_data, kind, scope):
    model, task, _ = build_model(toy_data, "transformer_postln_tiny", *SMALL, "--lnpos-qk-norm", kind,
                                 "--lnpos-qk-norm-scope", scope)
    model.double()
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=TOL)
    # the keys fairseq caches are normalised (the norms' weights 1 and biases 0 at initialization)
    src = torch.randint(4, len(task.source_dictionary), (2, 6))
    prev = torch.randint(4, len(task.target_dictionary), (2, 4))
    state = {}
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((2,), 6))
        for t in range(4):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
    layer = model.decoder.layers[1]
    for attn, length in ((layer.self_attn, 4), (layer.encoder_attn, 6)):
        keys = attn._get_input_buffer(state)["prev_key"]  # B x H x T x d_head
        assert keys.shape == (2, 4, length, 32)
        keys = keys if scope == "head" else keys.permute(0, 2, 1, 3).reshape(2, length, 1, 128)
        mean, square = keys.mean(-1), (keys ** 2).mean(-1)
        if kind == "layernorm":  # mean 0, variance 1 (less eps's share)
            assert float(mean.abs().max()) < TOL and float((square - 1).abs().max()) < 1e-3
        elif kind == "rmsnorm":  # root mean square 1
            assert float((square - 1).abs().max()) < 1e-3
        else:  # unit length
            assert float((square * keys.shape[-1] - 1).abs().max()) < TOL


def test_l2_has_the_official_scale(toy_data):
    """Henry et al.'s g: one learned scalar per attention module, log2(L^2 - L) at initialization, in place
    of fairseq's 1/sqrt(d_head); the logits the diagnostics log are g times the cosine of q and k."""
    from fairseq_lnpos.diagnostics import attention_logits

    model, _, _ = build_model(toy_data, "transformer_postln_tiny", *SMALL, "--lnpos-qk-norm", "l2")
    attns = [m for m in model.modules() if isinstance(m, QKNormalization)]
    assert len(attns) == 2 + 2 * 2  # every self- and cross-attention
    assert all(a.scale.shape == () and a.scale.item() == pytest.approx(math.log2(72 * 72 - 72)) for a in attns)
    assert DEFAULT_QK_LENGTH == 72
    model, _, _ = build_model(toy_data, "transformer_postln_tiny", *SMALL, "--lnpos-qk-norm", "l2",
                              "--lnpos-qk-norm-length", 10)
    attn = model.encoder.layers[0].self_attn
    assert attn.qk_norm.scale.item() == pytest.approx(math.log2(90)) and attn.scaling == 1.0
    x = torch.randn(6, 2, 128)
    logits, _ = attention_logits(attn, x, x)  # B x H x T x S
    q = l2_normalize(linear(attn.q_proj, x).reshape(6, 2, 4, 32)).permute(1, 2, 0, 3)
    k = l2_normalize(linear(attn.k_proj, x).reshape(6, 2, 4, 32)).permute(1, 2, 0, 3)
    assert torch.allclose(logits, math.log2(90) * q @ k.transpose(-1, -2), atol=1e-4)
    assert float(logits.abs().max()) <= math.log2(90) + 1e-4  # bounded by g
    model.train()
    out, _ = model.encoder.layers[0].self_attn(query=x, key=x, value=x, key_padding_mask=None)
    out.sum().backward()
    assert attn.qk_norm.scale.grad is not None and attn.qk_norm.scale.grad.abs() > 0  # learned


def test_the_norms_add_parameters_and_change_no_other(toy_data):
    """They draw no random numbers: with the same seed every other parameter is the model's without them."""
    plain, _, _ = build_model(toy_data, "transformer_postln_tiny", *SMALL, seed=5)
    normed, _, _ = build_model(toy_data, "transformer_postln_tiny", *SMALL, "--lnpos-qk-norm", "layernorm", seed=5)
    theirs, ours = plain.state_dict(), normed.state_dict()
    added = sorted(set(ours) - set(theirs))
    assert set(theirs) <= set(ours) and same_state(theirs, {k: ours[k] for k in theirs})
    assert added == sorted(f"{side}.layers.{i}.{attn}.qk_norm.{qk}.{p}"
                           for side, attns in (("encoder", ["self_attn"]), ("decoder", ["self_attn", "encoder_attn"]))
                           for i in range(2) for attn in attns for qk in "qk" for p in ("weight", "bias"))
    assert ours["encoder.layers.0.self_attn.qk_norm.q.weight"].shape == (32,)  # per head: d_head, shared


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_takes_the_option(toy_data, variant):
    arch = arch_name(variant, "tiny")
    model, _, args = build_model(toy_data, arch, *two_layers(arch), "--lnpos-qk-norm", "rmsnorm")
    attns = [m for m in model.modules() if type(m).__name__ == "MultiheadAttention"]
    assert len(attns) == 2 + 2 * 2 and all(a.qk_norm.q.kind == "rmsnorm" for a in attns)
    width = getattr(args, "lnpos_qk_norm_scope", None) == "width"
    assert all(a.qk_norm.q.dim == (128 if width else 32) for a in attns)
    assert width == (variant == "olmo2")  # OLMo-2's scope unless the option gives another
    assert all((a.qk_norm.v is not None) == variant.startswith("hybridnorm") for a in attns)


@pytest.mark.parametrize("arch,extra,message", [
    ("postln", ("--lnpos-qk-norm-scope", "width"), "--lnpos-qk-norm-scope width: there is no QK-norm"),
    ("postln", ("--lnpos-qk-norm", "layernorm", "--lnpos-qk-norm-length", 10),
     "--lnpos-qk-norm-length 10: only --lnpos-qk-norm l2 has a length"),
    ("postln", ("--lnpos-qk-norm", "l2", "--lnpos-qk-norm-length", 1), "--lnpos-qk-norm-length must be at least 2"),
    ("olmo2", ("--lnpos-qk-norm", "none"), "--lnpos-qk-norm none: transformer_olmo2_tiny normalises q and k"),
    ("hybridnorm", ("--lnpos-qk-norm", "l2"), "--lnpos-qk-norm l2: this arch normalises the values as well"),
])
def test_an_option_that_changes_nothing_or_contradicts_the_arch_is_refused(toy_data, arch, extra, message):
    with pytest.raises(LnposError) as e:
        build_model(toy_data, arch_name(arch, "tiny"), *SMALL, *extra)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.slow
def test_fairseq_trains_olmo2_and_post_ln_with_l2_qk_norm_and_generates(toy_data, tmp_path):
    """Training and validation (the paths fairseq would otherwise run fused) and beam search (the cache)."""
    common = ["--user-dir", USER_DIR, "--cpu"]
    for arch, extra in (("transformer_olmo2_tiny", []), ("transformer_postln_tiny", ["--lnpos-qk-norm", "l2"])):
        save = tmp_path / arch
        train = run(fairseq_cmd(
            "fairseq-train", toy_data, *common, "--arch", arch, *extra, *SMALL, "--optimizer", "adam",
            "--lr", "5e-4", "--max-tokens", "1000", "--max-update", "2", "--save-dir", save,
            "--no-progress-bar", "--log-interval", "1"))
        log = train.stdout + train.stderr
        assert train.returncode == 0, log[-3000:]
        assert re.findall(r"num_updates=(\d+)", log)[:2] == ["1", "2"] and "valid on 'valid' subset" in log
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)
    assert state["cfg"]["model"].lnpos_qk_norm == "l2"  # fairseq's saved model options
    assert "encoder.layers.0.self_attn.qk_norm.scale" in state["model"]
    gen = run(fairseq_cmd("fairseq-generate", toy_data, *common, "--path", save / "checkpoint_last.pt",
                          "--beam", "2", "--max-len-a", "1", "--max-len-b", "3", "--batch-size", "64"))
    assert gen.returncode == 0, gen.stderr[-3000:]
    generated_bleu(gen.stdout)
