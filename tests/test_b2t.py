"""B2T connection: Post-LN with the layer's input added before its last LayerNorm; weights x L^-1/2."""
import logging

import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.models.b2t import b2t_scale
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn

SMALL = ("--encoder-layers", 3, "--decoder-layers", 2)


@pytest.fixture(scope="module")
def b2t(toy_data):
    model, task, args = build_model(toy_data, "transformer_b2t_tiny", *SMALL)
    randomize_norms(model)
    return model, task, args


def test_every_size_is_a_post_ln_b2t_model(toy_data):
    for size in SIZES:
        model, _, _ = build_model(toy_data, arch_name("b2t", size), "--encoder-layers", 1, "--decoder-layers", 1)
        assert type(model).__name__ == "B2TTransformerModel"
        assert model.encoder.layer_norm is None and not model.decoder.layers[0].normalize_before


def test_init_is_post_ln_with_every_sublayer_weight_times_depth_to_the_minus_half(toy_data, caplog):
    with caplog.at_level(logging.INFO, logger="fairseq_lnpos.models.b2t"):
        ours, _, _ = build_model(toy_data, "transformer_b2t_iwslt_de_en", *SMALL, seed=6)
    assert "B2T 3-2: sublayer weights x0.5774 (encoder), x0.7071 (decoder)" in caplog.text
    post, _, _ = build_model(toy_data, "transformer_postln_iwslt_de_en", *SMALL, seed=6)
    a, b = ours.state_dict(), post.state_dict()
    assert list(a) == list(b)
    scaled = 0
    for name, value in a.items():
        stack = name.split(".")[0]
        if ".layers." in name and name.endswith(("proj.weight", "fc1.weight", "fc2.weight")):
            scale = b2t_scale(3 if stack == "encoder" else 2)
            assert torch.allclose(value, b[name] * scale, rtol=1e-6, atol=0), name
            scaled += 1
        elif not name.endswith("_float_tensor"):
            assert torch.equal(value, b[name]), name  # biases, LayerNorms, embeddings: fairseq's
    assert scaled == 3 * 6 + 2 * 10  # encoder: q, k, v, out, fc1, fc2; decoder: two attentions too


def test_encoder_layer_adds_its_input_before_the_last_layernorm(b2t):
    model, _, _ = b2t
    layer = model.encoder.layers[1]
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        y = layer.self_attn_layer_norm(x + self_attn(layer, x))
        expected = layer.final_layer_norm(x + y + ffn(layer, y))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_adds_its_input_before_the_last_of_three_layernorms(b2t):
    model, _, _ = b2t
    layer = model.decoder.layers[1]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    with torch.no_grad():
        y = layer.self_attn_layer_norm(x + self_attn(layer, x, attn_mask=CAUSAL))
        z = layer.encoder_attn_layer_norm(y + cross_attn(layer, y, enc))
        expected = layer.final_layer_norm(x + z + ffn(layer, z))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=CAUSAL)[0]
    assert torch.allclose(got, expected, atol=1e-5)
    assert layer.layer_input is None  # the input is not kept after the forward


def test_incremental_decoding_equals_the_full_forward(b2t):
    model, task, _ = b2t
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)
