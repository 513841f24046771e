"""OLMo-2's reordered norm (``transformer_olmo2``): ``x + N(F(x))``, a final norm per stack, q and k
normalised over the full width; the official block (allenai/OLMo ``olmo/model.py``,
``OLMoSequentialBlock.forward`` under ``norm_after``) re-derived in plain torch, float64."""
import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from helpers import decode_both_ways, randomize_norms
from test_qknorm import TOL, NO_DROPOUT, SMALL, attention, causal, ffn, ln

QK = ("layernorm", "width")


@pytest.fixture(scope="module")
def olmo2(toy_data):
    model, task, args = build_model(toy_data, "transformer_olmo2_tiny", *SMALL, *NO_DROPOUT)
    randomize_norms(model)  # the QK-norms' too
    return model.double(), task, args


def test_qk_norm_is_on_over_the_full_width_and_there_is_no_input_norm(olmo2):
    model, _, args = olmo2
    assert (args.lnpos_qk_norm, args.lnpos_qk_norm_scope) == QK and args.encoder_normalize_before
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.layer_norm, torch.nn.LayerNorm)  # the final norm per stack
        for layer in stack.layers:
            assert isinstance(layer.self_attn_layer_norm, torch.nn.Identity)
            assert isinstance(layer.final_layer_norm, torch.nn.Identity)
            assert layer.self_attn.qk_norm.q.dim == 128


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_encoder_layer_is_the_official_block(olmo2, mode):
    model, _, _ = olmo2
    model.train(mode == "train")
    layer = model.encoder.layers[1]
    x = torch.randn(7, 2, 128, dtype=torch.float64) * 3
    h = x + ln(layer.self_attn_out_norm, attention(layer.self_attn, x, x, qk=QK))
    expected = h + ln(layer.ffn_out_norm, ffn(layer, h))
    with torch.no_grad():
        assert torch.allclose(layer(x, encoder_padding_mask=None), expected, atol=TOL)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_decoder_layer_is_the_official_block_over_three_sublayers(olmo2, mode):
    model, _, _ = olmo2
    model.train(mode == "train")
    layer = model.decoder.layers[1]
    x, memory = torch.randn(5, 2, 128, dtype=torch.float64), torch.randn(7, 2, 128, dtype=torch.float64)
    h = x + ln(layer.self_attn_out_norm, attention(layer.self_attn, x, x, causal(5), qk=QK))
    h = h + ln(layer.encoder_attn_out_norm, attention(layer.encoder_attn, h, memory, qk=QK))
    expected = h + ln(layer.ffn_out_norm, ffn(layer, h))
    with torch.no_grad():
        got = layer(x, encoder_out=memory, encoder_padding_mask=None, self_attn_mask=causal(5))[0]
    assert torch.allclose(got, expected, atol=TOL)


def test_incremental_decoding_equals_the_full_forward(olmo2):
    model, task, _ = olmo2
    model.eval()
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=TOL)
