"""SiameseNorm (``transformer_siamesenorm``): two streams sharing each sublayer, the post stream
normalised before every sublayer and fed a 1/c_l share, the pre stream the whole output; the
official block (Qwen-Applications/SiameseNorm ``deit-model-siamesenorm.py``, ``Block.forward``)
re-derived in plain torch, float64, with the decoder's cross-attention as a third sublayer."""
import math

import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from helpers import decode_both_ways, randomize_norms
from test_qknorm import TOL, NO_DROPOUT, SMALL, attention, causal, ffn, ln


@pytest.fixture(scope="module")
def siamese(toy_data):
    model, task, args = build_model(toy_data, "transformer_siamesenorm_tiny", *SMALL, *NO_DROPOUT)
    randomize_norms(model)
    return model.double(), task, args


def block(layer, x, y, sublayers, c):
    """The official block: for each sublayer x = N_post(x); z = F(N_in(x + N_pre(y))); x += z / c; y += z."""
    for name, post, f in sublayers:
        x = ln(post, x)
        z = f(ln(getattr(layer, f"{name}_input_norm"), x + ln(getattr(layer, f"{name}_pre_norm"), y)))
        x, y = x + z / c, y + z
    return torch.cat((x, y), -1)


def test_c_l_counts_the_sublayers_up_to_the_layer(siamese):
    model, _, _ = siamese
    assert [layer.branch_scale for layer in model.encoder.layers] == pytest.approx([2 ** -0.5, 4 ** -0.5])
    assert [layer.branch_scale for layer in model.decoder.layers] == pytest.approx([3 ** -0.5, 6 ** -0.5])


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_encoder_layers_are_the_official_block(siamese, mode):
    model, _, _ = siamese
    model.train(mode == "train")
    x, y = torch.randn(7, 2, 128, dtype=torch.float64) * 3, torch.randn(7, 2, 128, dtype=torch.float64) * 5
    for index, (inp, y0) in enumerate([(x, x), (torch.cat((x, y), -1), y)]):  # layer 0 gets the embeddings only
        layer = model.encoder.layers[index]
        expected = block(layer, x, y0, [("self_attn", layer.self_attn_layer_norm, lambda h: attention(layer.self_attn, h, h)),
                                        ("ffn", layer.final_layer_norm, lambda h: ffn(layer, h))],
                         math.sqrt(2 * (index + 1)))
        with torch.no_grad():
            assert torch.allclose(layer(inp, encoder_padding_mask=None), expected, atol=TOL)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_decoder_layer_is_the_official_block_with_cross_attention_as_a_third_sublayer(siamese, mode):
    model, _, _ = siamese
    model.train(mode == "train")
    layer = model.decoder.layers[1]
    x, y, memory = (torch.randn(n, 2, 128, dtype=torch.float64) for n in (5, 5, 7))
    expected = block(layer, x, y, [
        ("self_attn", layer.self_attn_layer_norm, lambda h: attention(layer.self_attn, h, h, causal(5))),
        ("encoder_attn", layer.encoder_attn_layer_norm, lambda h: attention(layer.encoder_attn, h, memory)),
        ("ffn", layer.final_layer_norm, lambda h: ffn(layer, h))], math.sqrt(3 * 2))
    with torch.no_grad():
        got = layer(torch.cat((x, y), -1), encoder_out=memory, encoder_padding_mask=None, self_attn_mask=causal(5))[0]
    assert torch.allclose(got, expected, atol=TOL)


def test_each_stack_ends_with_n_final_of_n_a_x_plus_n_b_y(siamese):
    model, _, _ = siamese
    x, y = torch.randn(4, 2, 128, dtype=torch.float64), torch.randn(4, 2, 128, dtype=torch.float64)
    for stack in (model.encoder, model.decoder):
        out = stack.layer_norm
        expected = ln(out.norm, ln(out.post_norm, x) + ln(out.pre_norm, y))
        assert torch.allclose(out(torch.cat((x, y), -1)), expected, atol=TOL)


def test_incremental_decoding_equals_the_full_forward(siamese):
    model, task, _ = siamese
    model.eval()
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=TOL)
