"""LayerNorm Scaling: Pre-LN with each sublayer's LayerNorm output scaled by 1/sqrt(l), l from 1 per stack."""
import math

import pytest
import torch

from conftest import build_model, same_state, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn
from test_models import batch

SMALL = ("--encoder-layers", 4, "--decoder-layers", 3)


@pytest.fixture(scope="module")
def lns(toy_data):
    model, task, args = build_model(toy_data, "transformer_lnscaling_tiny", *SMALL)
    randomize_norms(model)
    return model, task, args


def test_every_size_is_pre_ln_with_the_scale_of_each_layers_index(toy_data):
    for size in SIZES:
        model, _, _ = build_model(toy_data, arch_name("lnscaling", size), *SMALL)
        assert type(model).__name__ == "LNScalingTransformerModel"
        assert isinstance(model.encoder.layer_norm, torch.nn.LayerNorm)
        assert [layer.ln_scale for layer in model.encoder.layers] == [1, 1 / math.sqrt(2), 1 / math.sqrt(3), 0.5]
        assert [layer.ln_scale for layer in model.decoder.layers] == [1, 1 / math.sqrt(2), 1 / math.sqrt(3)]


def test_same_parameters_as_fairseqs_pre_ln_and_different_outputs(toy_data):
    ours, task, _ = build_model(toy_data, arch_name("lnscaling", "iwslt_de_en"), seed=7)
    theirs, _, _ = build_model(toy_data, "transformer_iwslt_de_en", "--encoder-normalize-before",
                               "--decoder-normalize-before", seed=7)
    assert same_state(ours.state_dict(), theirs.state_dict())
    with torch.no_grad():
        assert not torch.allclose(ours(*batch(task))[0], theirs(*batch(task))[0], atol=1e-3)


@pytest.mark.parametrize("index", [0, 3])
def test_encoder_layer_formula(lns, index):
    model, _, _ = lns
    layer = model.encoder.layers[index]
    s = 1 / math.sqrt(index + 1)
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        h = x + self_attn(layer, s * layer.self_attn_layer_norm(x))
        expected = h + ffn(layer, s * layer.final_layer_norm(h))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_scales_the_cross_attention_query_not_the_encoder_output(lns):
    model, _, _ = lns
    layer = model.decoder.layers[2]
    s = 1 / math.sqrt(3)
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    with torch.no_grad():
        h = x + self_attn(layer, s * layer.self_attn_layer_norm(x), attn_mask=CAUSAL)
        h = h + cross_attn(layer, s * layer.encoder_attn_layer_norm(h), enc)
        expected = h + ffn(layer, s * layer.final_layer_norm(h))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=CAUSAL)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(lns):
    model, task, _ = lns
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_a_stack_of_one_layer_is_refused(toy_data, side):
    """Its one layer is scaled by 1/sqrt(1): Pre-LN, which would be labelled LN-Scaling."""
    with pytest.raises(LnposError, match=rf"^transformer_lnscaling_tiny: one {side} layer is scaled by 1/sqrt\(1\) = 1, "
                                         r"so that stack is Pre-LN, not LN-Scaling"):
        build_model(toy_data, "transformer_lnscaling_tiny", f"--{side}-layers", 1)
