"""HybridNorm and HybridNorm* (``transformer_hybridnorm``, ``_hybridnorm_star``): q, k and v normalised
per head, no norm on the attention's input, the FFN's residual after its norm, a final norm per
stack; HybridNorm*'s first layer Pre-Norm. The official block (BryceZhuo/HybridNorm
``dense_model/olmo/model.py``, ``OLMoSequentialBlock.forward``) re-derived in plain torch, float64."""
import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from helpers import decode_both_ways, randomize_norms
from test_qknorm import TOL, NO_DROPOUT, SMALL, attention, causal, ffn, ln

QKV = dict(qk=("layernorm", "head"), values=True)


@pytest.fixture(scope="module", params=["hybridnorm", "hybridnorm_star"])
def hybrid(toy_data, request):
    model, task, args = build_model(toy_data, f"transformer_{request.param}_tiny", *SMALL, *NO_DROPOUT)
    randomize_norms(model)  # the QKV-norms' too
    return model.double(), task, request.param == "hybridnorm_star"


def test_q_k_and_v_are_normalised_per_head_and_each_stack_ends_with_a_norm(hybrid):
    model, _, star = hybrid
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.layer_norm, torch.nn.LayerNorm)
        assert [layer.normalize_before for layer in stack.layers] == [star, False]
        for layer in stack.layers:
            for attn in [layer.self_attn] + [getattr(layer, "encoder_attn", None)] * (stack is model.decoder):
                assert attn.qk_norm.q.kind == "layernorm" and attn.qk_norm.v.dim == 32


def encoder_block(layer, x, pre):
    if pre:  # HybridNorm*'s first layer: Pre-Norm, with q, k, v normalised
        h = ln(layer.self_attn_layer_norm, x)
        y = x + attention(layer.self_attn, h, h, **QKV)
        return y + ffn(layer, ln(layer.final_layer_norm, y))
    y = x + attention(layer.self_attn, x, x, **QKV)
    n = ln(layer.self_attn_layer_norm, y)  # the FFN's norm N (fairseq's Post-LN slot after the attention)
    return n + ffn(layer, n)


def decoder_block(layer, x, memory, pre):
    if pre:
        h = ln(layer.self_attn_layer_norm, x)
        y = x + attention(layer.self_attn, h, h, causal(5), **QKV)
        y = y + attention(layer.encoder_attn, ln(layer.encoder_attn_layer_norm, y), memory, **QKV)
        return y + ffn(layer, ln(layer.final_layer_norm, y))
    y = x + attention(layer.self_attn, x, x, causal(5), **QKV)
    y = y + attention(layer.encoder_attn, y, memory, **QKV)
    n = ln(layer.encoder_attn_layer_norm, y)
    return n + ffn(layer, n)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("index", [0, 1])
def test_layers_are_the_official_block(hybrid, mode, index):
    model, _, star = hybrid
    model.train(mode == "train")
    pre = star and index == 0
    enc, dec = model.encoder.layers[index], model.decoder.layers[index]
    for layer, ffn_norm in ((enc, "self_attn_layer_norm"), (dec, "encoder_attn_layer_norm")):
        names = [n for n in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm") if hasattr(layer, n)]
        kept = [n for n in names if isinstance(getattr(layer, n), torch.nn.LayerNorm)]
        assert kept == (names if pre else [ffn_norm])  # a HybridNorm layer has the FFN's norm only
    x, memory = torch.randn(5, 2, 128, dtype=torch.float64) * 3, torch.randn(7, 2, 128, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(enc(x, encoder_padding_mask=None), encoder_block(enc, x, pre), atol=TOL)
        got = dec(x, encoder_out=memory, encoder_padding_mask=None, self_attn_mask=causal(5))[0]
        assert torch.allclose(got, decoder_block(dec, x, memory, pre), atol=TOL)


def test_incremental_decoding_equals_the_full_forward(hybrid):
    model, task, _ = hybrid
    model.eval()
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=TOL)


def test_a_hybridnorm_star_stack_of_one_layer_is_refused(toy_data):
    with pytest.raises(LnposError, match="a decoder of one layer is that Pre-Norm layer only"):
        build_model(toy_data, "transformer_hybridnorm_star_tiny", "--decoder-layers", 1)
