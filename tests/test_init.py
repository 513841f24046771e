"""``--lnpos-init``: fairseq 0.12's initialization (default) or fairseq 0.8's, on every plugin arch.

Each weight group is checked against its formula (mean, std, bound, bias); the variants with an
initialization of their own (DeepNorm, T-Fixup) apply it on top of the chosen one.
"""
import math

import pytest
import torch

from conftest import build_model, same_state, toy_data, two_layers  # noqa: F401
from fairseq_lnpos.models.deepnorm import deepnorm_coefficients
from fairseq_lnpos.models.tfixup import tfixup_scales
from fairseq_lnpos.models.variant import layer_attentions
from fairseq_lnpos.variants import VARIANTS

# IWSLT width (d 512, FFN 1024) for tight statistics, two layers for speed
D, FFN = 512, 1024
RTOL = 0.03  # std of >= 262k draws: relative standard error < 0.2 %


def layers(model):
    return list(model.encoder.layers) + list(model.decoder.layers)


def assert_uniform(t, bound):
    """``t`` looks drawn from U(-bound, bound): within the bound, mean 0, std bound/sqrt(3)."""
    t = t.detach().double()
    assert t.abs().max() <= bound * (1 + 1e-6)
    assert abs(float(t.mean())) < 4 * bound / math.sqrt(3 * t.numel())
    assert float(t.std()) == pytest.approx(bound / math.sqrt(3), rel=RTOL if t.numel() > 10000 else 0.2)


def assert_normal(t, std):
    t = t.detach().double()
    assert abs(float(t.mean())) < 4 * std / math.sqrt(t.numel())
    assert float(t.std()) == pytest.approx(std, rel=RTOL)
    assert t.abs().max() > 3 * std  # a normal, not a uniform of that std (bound sqrt(3) std)


def xavier_bound(fan_in, fan_out, gain=1.0):
    return gain * math.sqrt(6 / (fan_in + fan_out))


def build(toy_data, variant, init=None, seed=1):
    arch = f"transformer_{variant}_iwslt_de_en"
    extra = two_layers(arch) + (() if init is None else ("--lnpos-init", init))
    model, _, args = build_model(toy_data, arch, *extra, seed=seed)
    return model, args


def check_shared_groups(model):
    """Groups whose initialization is the same in fairseq 0.8 and 0.12 (and untouched by the variants
    checked here): q/k weights, embeddings, LayerNorms."""
    emb = model.encoder.embed_tokens.weight
    pad = model.encoder.embed_tokens.padding_idx
    assert torch.equal(emb[pad], torch.zeros(D))
    assert_normal(torch.cat([emb[:pad], emb[pad + 1:]]), D ** -0.5)
    for layer in layers(model):
        for attn in layer_attentions(layer):
            for proj in (attn.q_proj, attn.k_proj):  # fairseq 0.8: one (3d, d) Xavier matrix: same bound
                assert_uniform(proj.weight, xavier_bound(D, 3 * D))
                assert_uniform(proj.weight, xavier_bound(D, D, gain=2 ** -0.5))
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.LayerNorm):
                assert torch.equal(module.weight, torch.ones(D)), name
                assert module.bias is None or torch.equal(module.bias, torch.zeros(D)), name


@pytest.mark.parametrize("init", ["fairseq-0.9", "fairseq-0.8"])
@pytest.mark.parametrize("variant", ["postln", "preln", "keel", "admin"])
def test_fairseq_08_and_09_inits_have_xavier_ffn_and_zero_ffn_biases(toy_data, variant, init):
    model, _ = build(toy_data, variant, init)
    check_shared_groups(model)
    for layer in layers(model):
        assert_uniform(layer.fc1.weight, xavier_bound(D, FFN))
        assert_uniform(layer.fc2.weight, xavier_bound(FFN, D))
        assert torch.equal(layer.fc1.bias, torch.zeros(FFN)) and torch.equal(layer.fc2.bias, torch.zeros(D))
        for attn in layer_attentions(layer):
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                if init == "fairseq-0.8":  # v0.8's in_proj_bias is zero
                    assert torch.equal(proj.bias, torch.zeros(D))
                else:  # v0.9's q/k/v nn.Linear keep PyTorch's default bias
                    assert_uniform(proj.bias, D ** -0.5)
            assert_uniform(attn.v_proj.weight, xavier_bound(D, D, gain=2 ** -0.5))
            assert_uniform(attn.out_proj.weight, xavier_bound(D, D))
            assert torch.equal(attn.out_proj.bias, torch.zeros(D))


@pytest.mark.parametrize("variant", ["postln", "preln", "keel", "admin"])
def test_fairseq_012_init_is_pytorch_default_linear(toy_data, variant):
    model, args = build(toy_data, variant)
    assert args.lnpos_init == "fairseq-0.12"
    check_shared_groups(model)
    for layer in layers(model):
        # nn.Linear's default: weight and bias uniform in +-1/sqrt(fan_in) (variance 1/(3 fan_in))
        assert_uniform(layer.fc1.weight, D ** -0.5)
        assert_uniform(layer.fc2.weight, FFN ** -0.5)
        assert_uniform(layer.fc1.bias, D ** -0.5)
        assert_uniform(layer.fc2.bias, FFN ** -0.5)
        for attn in layer_attentions(layer):
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                assert_uniform(proj.bias, D ** -0.5)
                assert proj.bias.abs().min() > 0


def test_deepnorm_applies_its_init_on_top_of_either(toy_data):
    betas = deepnorm_coefficients(2, 2)
    for init in ("fairseq-0.12", "fairseq-0.8"):
        model, _ = build(toy_data, "deepnorm", init)
        for side in ("encoder", "decoder"):
            beta = betas[side][1]
            for layer in getattr(model, side).layers:
                # Xavier-normal with gain beta, whichever init came first
                assert_normal(layer.fc1.weight, beta * math.sqrt(2 / (D + FFN)))
                assert_normal(layer.fc2.weight, beta * math.sqrt(2 / (D + FFN)))
                biases = [layer.fc1.bias, layer.fc2.bias] + [
                    p.bias for a in layer_attentions(layer) for p in (a.q_proj, a.k_proj, a.v_proj)]
                assert all(bool((b == 0).all()) == (init == "fairseq-0.8") for b in biases)


def test_tfixup_applies_its_init_on_top_of_either(toy_data):
    scales = tfixup_scales(2, 2)
    for init in ("fairseq-0.12", "fairseq-0.8"):
        model, _ = build(toy_data, "tfixup", init)
        for side in ("encoder", "decoder"):
            scale = scales[side][0]
            for layer in getattr(model, side).layers:
                assert_uniform(layer.fc1.weight, xavier_bound(D, FFN, gain=scale))
                assert torch.equal(layer.fc1.bias, torch.zeros(FFN))  # T-Fixup's own
                for attn in layer_attentions(layer):
                    assert_uniform(attn.v_proj.weight, xavier_bound(D, D, gain=scale))
                    assert bool((attn.v_proj.bias == 0).all()) == (init == "fairseq-0.8")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_default_is_fairseq_012_and_the_option_changes_the_model(toy_data, variant):
    default, _ = build(toy_data, variant, seed=5)
    explicit, _ = build(toy_data, variant, "fairseq-0.12", seed=5)
    old, args = build(toy_data, variant, "fairseq-0.8", seed=5)
    assert args.lnpos_init == "fairseq-0.8"
    assert same_state(default.state_dict(), explicit.state_dict())
    fc2 = "encoder.layers.0.fc2.bias"
    assert torch.equal(old.state_dict()[fc2], torch.zeros(D))
    assert not same_state(default.state_dict(), old.state_dict())


def test_unknown_init_is_refused_by_the_parser(toy_data, capsys):
    with pytest.raises(SystemExit) as exit_:
        build(toy_data, "postln", "fairseq-0.7")
    assert exit_.value.code == 2
    assert "--lnpos-init: invalid choice: 'fairseq-0.7'" in capsys.readouterr().err
