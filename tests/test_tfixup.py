"""T-Fixup: x + F(x) with no LayerNorm anywhere, and the paper's depth-scaled initialisation."""
import math

import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.models.tfixup import tfixup_scales
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import decode_both_ways, fairseq_generate, fairseq_train, ffn


def test_scales_for_6_6_and_other_depths_follow_the_paper():
    c = tfixup_scales(6, 6)
    assert [round(v, 4) for v in c["encoder"]] == [0.4281, 0.3689]
    assert [round(v, 4) for v in c["decoder"]] == [0.3689, 0.3689]
    c = tfixup_scales(18, 3)
    assert c["encoder"] == pytest.approx((0.67 * 18 ** -0.25, (9 * 18) ** -0.25))
    assert c["decoder"] == pytest.approx(((9 * 3) ** -0.25, (9 * 3) ** -0.25))


@pytest.mark.parametrize("n,m", [(0, 6), (6, 0)])
def test_zero_layers_is_an_error(n, m):
    with pytest.raises(LnposError, match="at least one"):
        tfixup_scales(n, m)


def is_layernorm(module):
    return isinstance(module, torch.nn.LayerNorm) or "LayerNorm" in type(module).__name__


@pytest.mark.parametrize("size", list(SIZES))
def test_no_layernorm_anywhere_in_any_size(toy_data, size):
    model, _, _ = build_model(toy_data, arch_name("tfixup", size), "--encoder-layers", 2, "--decoder-layers", 2,
                              "--encoder-normalize-before", "--decoder-normalize-before")
    assert type(model).__name__ == "TFixupTransformerModel"
    assert not [name for name, m in model.named_modules() if is_layernorm(m)]
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None


def test_layernorm_embedding_is_refused(toy_data):
    with pytest.raises(LnposError, match="T-Fixup has no LayerNorm: drop --layernorm-embedding"):
        build_model(toy_data, "transformer_tfixup_tiny", "--layernorm-embedding")


def xavier_uniform_std(w, gain=1.0):
    fan_out, fan_in = w.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_init_scales_within_5_percent_of_the_formula(toy_data, side):
    n, m = 4, 2  # different depths: each stack must use its own
    model, _, args = build_model(toy_data, "transformer_tfixup_iwslt_de_en", "--encoder-layers", n,
                                 "--decoder-layers", m, seed=3)
    model.requires_grad_(False)
    scale, embed_scale = tfixup_scales(n, m)[side]
    for layer in getattr(model, side).layers:
        attns = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
        scaled = [layer.fc1.weight, layer.fc2.weight] + [w for a in attns for w in (a.v_proj.weight, a.out_proj.weight)]
        for w in scaled:
            assert float(w.std()) == pytest.approx(xavier_uniform_std(w, scale), rel=0.05)
        for w in [w for a in attns for w in (a.q_proj.weight, a.k_proj.weight)]:  # fairseq's own init
            assert float(w.std()) == pytest.approx(xavier_uniform_std(w, 2 ** -0.5), rel=0.05)
        assert not layer.fc1.bias.any() and not layer.fc2.bias.any()
    embed = getattr(model, side).embed_tokens
    rows = torch.arange(embed.num_embeddings) != embed.padding_idx
    d = args.encoder_embed_dim
    assert float(embed.weight[rows].std()) == pytest.approx(d ** -0.5 * embed_scale, rel=0.05)
    assert not embed.weight[embed.padding_idx].any()


def test_a_shared_embedding_is_scaled_once(toy_data):
    model, _, args = build_model(toy_data, "transformer_tfixup_iwslt_de_en", "--share-all-embeddings", seed=3)
    model.requires_grad_(False)
    embed = model.encoder.embed_tokens
    assert model.decoder.embed_tokens is embed
    assert float(embed.weight[4:].std()) == pytest.approx(args.encoder_embed_dim ** -0.5 * (9 * 6) ** -0.25, rel=0.05)


@pytest.fixture(scope="module")
def tfixup(toy_data):
    return build_model(toy_data, "transformer_tfixup_tiny", "--encoder-layers", 3, "--decoder-layers", 2)


def test_encoder_layer_is_x_plus_sublayer(tfixup):
    model, _, _ = tfixup
    layer = model.encoder.layers[1]
    x = torch.randn(6, 2, 128)
    with torch.no_grad():
        h = x + layer.self_attn(x, x, x, need_weights=False)[0]
        expected = h + ffn(layer, h)
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_is_x_plus_sublayer_for_all_three_sublayers(tfixup):
    model, _, _ = tfixup
    layer = model.decoder.layers[1]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with torch.no_grad():
        h = x + layer.self_attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        h = h + layer.encoder_attn(h, enc, enc, need_weights=False)[0]
        expected = h + ffn(layer, h)
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=mask)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(tfixup):
    model, task, _ = tfixup
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)


@pytest.mark.slow
def test_tfixup_trains_and_decodes_with_fairseq(toy_data, tmp_path):
    log = fairseq_train(toy_data, tmp_path, "transformer_tfixup_tiny")
    assert "T-Fixup 6-6: encoder sublayers x0.4281, embeddings x0.3689; decoder sublayers x0.3689" in log
    assert "num_updates=2" in log
    fairseq_generate(toy_data, tmp_path)
