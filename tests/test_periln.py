"""Peri-LN: x + LN_out(F(LN_in(x))) for every sublayer, LN_out before dropout, final LN per stack."""
import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn

SMALL = ("--encoder-layers", 2, "--decoder-layers", 3)


@pytest.fixture(scope="module")
def periln(toy_data):
    model, task, args = build_model(toy_data, "transformer_periln_tiny", *SMALL)
    randomize_norms(model)
    return model, task, args


@pytest.mark.parametrize("size", list(SIZES))
def test_every_size_is_pre_ln_with_output_norms_and_a_final_ln(toy_data, size):
    model, _, _ = build_model(toy_data, arch_name("periln", size), "--encoder-layers", 1, "--decoder-layers", 1)
    assert type(model).__name__ == "PeriLNTransformerModel"
    assert isinstance(model.encoder.layer_norm, torch.nn.LayerNorm)
    assert isinstance(model.decoder.layer_norm, torch.nn.LayerNorm)
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert enc.normalize_before and dec.normalize_before
    assert {n for n, m in enc.named_children() if n.endswith("_out_norm")} == {"self_attn_out_norm", "ffn_out_norm"}
    assert {n for n, m in dec.named_children() if n.endswith("_out_norm")} == {
        "self_attn_out_norm", "encoder_attn_out_norm", "ffn_out_norm"}


def test_encoder_layer_formula(periln):
    model, _, _ = periln
    layer = model.encoder.layers[1]
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        h = x + layer.self_attn_out_norm(self_attn(layer, layer.self_attn_layer_norm(x)))
        expected = h + layer.ffn_out_norm(ffn(layer, layer.final_layer_norm(h)))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_formula_for_all_three_sublayers(periln):
    model, _, _ = periln
    layer = model.decoder.layers[2]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    with torch.no_grad():
        h = x + layer.self_attn_out_norm(self_attn(layer, layer.self_attn_layer_norm(x), attn_mask=CAUSAL))
        h = h + layer.encoder_attn_out_norm(cross_attn(layer, layer.encoder_attn_layer_norm(h), enc))
        expected = h + layer.ffn_out_norm(ffn(layer, layer.final_layer_norm(h)))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=CAUSAL)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_output_norm_comes_before_dropout(toy_data):
    model, _, _ = build_model(toy_data, "transformer_periln_tiny", *SMALL, "--dropout", 0.3)
    randomize_norms(model)
    layer = model.encoder.layers[0]
    layer.train()
    x = torch.randn(6, 2, 128)
    drop = torch.nn.functional.dropout
    with torch.no_grad():
        torch.manual_seed(5)
        got = layer(x, encoder_padding_mask=None)
        torch.manual_seed(5)  # the same two dropout masks, in the same order
        h = x + drop(layer.self_attn_out_norm(self_attn(layer, layer.self_attn_layer_norm(x))), 0.3)
        expected = h + drop(layer.ffn_out_norm(ffn(layer, layer.final_layer_norm(h))), 0.3)
    assert torch.allclose(got, expected, atol=1e-5)


def test_lnpos_norm_replaces_the_output_norms_too(toy_data):
    model, _, _ = build_model(toy_data, "transformer_periln_tiny", *SMALL, "--lnpos-norm", "rmsnorm")
    randomize_norms(model)
    layer = model.encoder.layers[0]
    assert isinstance(layer.ffn_out_norm, torch.nn.RMSNorm) and isinstance(layer.self_attn_out_norm, torch.nn.RMSNorm)
    x = torch.randn(6, 2, 128)
    with torch.no_grad():
        h = x + layer.self_attn_out_norm(self_attn(layer, layer.self_attn_layer_norm(x)))
        expected = h + layer.ffn_out_norm(ffn(layer, layer.final_layer_norm(h)))
        assert torch.allclose(layer(x, encoder_padding_mask=None), expected, atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(periln):
    model, task, _ = periln
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)
