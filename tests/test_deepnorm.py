"""DeepNorm: alpha/beta from (N, M), the block LN(alpha * x + G(x)), and the init gains."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.models.deepnorm import deepnorm_coefficients
from helpers import ffn


def test_coefficients_for_6_6_match_the_paper():
    c = deepnorm_coefficients(6, 6)
    assert [round(v, 3) for v in c["encoder"]] == [1.418, 0.497]
    assert [round(v, 3) for v in c["decoder"]] == [2.060, 0.343]


def test_coefficients_follow_the_formula_for_other_depths():
    n, m = 18, 3
    c = deepnorm_coefficients(n, m)
    assert c["encoder"] == pytest.approx((0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)))
    assert c["decoder"] == pytest.approx(((3 * m) ** 0.25, (12 * m) ** -0.25))


@pytest.mark.parametrize("n,m", [(0, 6), (6, 0), (-1, 2)])
def test_zero_layers_is_an_error(n, m):
    with pytest.raises(LnposError, match="at least one"):
        deepnorm_coefficients(n, m)


def test_alpha_beta_follow_the_actual_layer_counts(toy_data):
    model, _, _ = build_model(toy_data, "transformer_deepnorm_tiny", "--encoder-layers", 4, "--decoder-layers", 2)
    c = deepnorm_coefficients(4, 2)
    assert model.encoder.layers[0].alpha == pytest.approx(c["encoder"][0])
    assert model.decoder.layers[1].alpha == pytest.approx(c["decoder"][0])


def test_encoder_layer_is_ln_of_alpha_x_plus_sublayer(toy_data):
    model, _, _ = build_model(toy_data, "transformer_deepnorm_tiny")
    layer = model.encoder.layers[2]
    alpha = deepnorm_coefficients(6, 6)["encoder"][0]
    x = torch.randn(9, 2, 128)
    with torch.no_grad():
        h = layer.self_attn_layer_norm(alpha * x + layer.self_attn(x, x, x, need_weights=False)[0])
        expected = layer.final_layer_norm(alpha * h + ffn(layer, h))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_is_ln_of_alpha_x_plus_sublayer_for_all_three_sublayers(toy_data):
    model, _, _ = build_model(toy_data, "transformer_deepnorm_tiny")
    layer = model.decoder.layers[5]
    alpha = deepnorm_coefficients(6, 6)["decoder"][0]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with torch.no_grad():
        h = layer.self_attn_layer_norm(alpha * x + layer.self_attn(x, x, x, attn_mask=mask, need_weights=False)[0])
        h = layer.encoder_attn_layer_norm(alpha * h + layer.encoder_attn(h, enc, enc, need_weights=False)[0])
        expected = layer.final_layer_norm(alpha * h + ffn(layer, h))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=mask)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def xavier_std(w, gain):
    fan_out, fan_in = w.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_init_gains_beta_for_ffn_value_output_and_one_for_query_key(toy_data, side):
    model, _, _ = build_model(toy_data, "transformer_deepnorm_iwslt_de_en", seed=3)
    beta = deepnorm_coefficients(6, 6)[side][1]
    for layer in getattr(model, side).layers:
        attns = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
        scaled = [layer.fc1.weight, layer.fc2.weight] + [w for a in attns for w in (a.v_proj.weight, a.out_proj.weight)]
        unscaled = [w for a in attns for w in (a.q_proj.weight, a.k_proj.weight)]
        for w in scaled:
            assert float(w.std()) == pytest.approx(xavier_std(w, beta), rel=0.05)
        for w in unscaled:
            assert float(w.std()) == pytest.approx(xavier_std(w, 1.0), rel=0.05)


def test_deepnorm_has_no_final_layernorm_and_is_post_ln(toy_data):
    model, _, args = build_model(toy_data, "transformer_deepnorm_tiny", "--encoder-normalize-before")
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    assert not any(layer.normalize_before for layer in model.encoder.layers)
