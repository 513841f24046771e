"""ResiDual: x_post = LN(x_post + F), x_dual = x_dual + s F, stack output x_post + LN_dual(x_dual)."""
import argparse
import logging

import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.models.residual import DUAL_NORM_EPS, DualStreamOutput, dual_scale
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn, tokens

SMALL = ("--encoder-layers", 3, "--decoder-layers", 2)
D = 128


def residual_model(data, *extra, seed=1):
    model, task, args = build_model(data, "transformer_residual_tiny", *SMALL, *extra, seed=seed)
    randomize_norms(model)
    return model, task, args


@pytest.fixture(scope="module")
def residual(toy_data):
    return residual_model(toy_data)


@pytest.fixture(scope="module")
def scaled(toy_data):
    return residual_model(toy_data, "--residual-dual-scale", 0.05)


def encoder_by_hand(model, src):
    """The encoder's output from its layers' own submodules (eval mode, no padding)."""
    enc = model.encoder
    post = enc.forward_embedding(src)[0].transpose(0, 1)
    s = enc.layers[0].dual_scale
    dual = s * post
    for layer in enc.layers:
        a = self_attn(layer, post)
        post = layer.self_attn_layer_norm(post + a)
        f = ffn(layer, post)
        post = layer.final_layer_norm(post + f)
        dual = dual + s * (a + f)
    return post + enc.layer_norm.norm(dual)


def decoder_by_hand(model, prev, enc_out):
    dec = model.decoder
    post = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    s = dec.layers[0].dual_scale
    dual = s * post
    for layer in dec.layers:
        a = self_attn(layer, post, attn_mask=CAUSAL)
        post = layer.self_attn_layer_norm(post + a)
        c = cross_attn(layer, post, enc_out)
        post = layer.encoder_attn_layer_norm(post + c)
        f = ffn(layer, post)
        post = layer.final_layer_norm(post + f)
        dual = dual + s * (a + c + f)
    return (post + dec.layer_norm.norm(dual)).transpose(0, 1)


@pytest.mark.parametrize("size", list(SIZES))
def test_every_size_is_post_ln_plus_a_dual_stream_with_fairseqs_init(toy_data, size):
    one = ("--encoder-layers", 1, "--decoder-layers", 1)
    model, _, _ = build_model(toy_data, arch_name("residual", size), *one, seed=4)
    assert type(model).__name__ == "ResiDualTransformerModel"
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.layer_norm, DualStreamOutput) and not stack.layers[0].normalize_before
        assert stack.layer_norm.norm.eps == DUAL_NORM_EPS
    ours, post = model.state_dict(), build_model(toy_data, arch_name("postln", size), *one, seed=4)[0].state_dict()
    new = [k for k in ours if k not in post]
    assert new == ["encoder.layer_norm.norm.weight", "encoder.layer_norm.norm.bias",
                   "decoder.layer_norm.norm.weight", "decoder.layer_norm.norm.bias"]
    assert all(ours[k].equal(v) for k, v in post.items() if not k.endswith("_float_tensor"))
    assert all(ours[k].equal(torch.ones_like(ours[k]) if k.endswith("weight") else torch.zeros_like(ours[k]))
               for k in new)


def assert_encoder_is_the_formula(model, task):
    src = tokens(task, 2, 6, 3)
    with torch.no_grad():
        got = model.encoder(src, src_lengths=torch.full((2,), 6))["encoder_out"][0]
        assert torch.allclose(got, encoder_by_hand(model, src), atol=1e-5)


def test_encoder_output_is_the_two_stream_formula(residual):
    assert_encoder_is_the_formula(*residual[:2])


def test_decoder_output_is_the_two_stream_formula_over_three_sublayers(residual):
    model, task, _ = residual
    prev, enc_out = tokens(task, 2, 5, 4), torch.randn(7, 2, D)
    with torch.no_grad():
        got = model.decoder(prev, encoder_out={"encoder_out": [enc_out], "encoder_padding_mask": []},
                            features_only=True)[0]
        assert torch.allclose(got, decoder_by_hand(model, prev, enc_out), atol=1e-5)


def test_a_layer_passes_both_streams_side_by_side(scaled):
    model, _, _ = scaled
    layer = model.encoder.layers[1]
    post, dual = torch.randn(6, 2, D), torch.randn(6, 2, D) * 5
    with torch.no_grad():
        a = self_attn(layer, post)
        y = layer.self_attn_layer_norm(post + a)
        f = ffn(layer, y)
        expected = torch.cat((layer.final_layer_norm(y + f), dual + 0.05 * (a + f)), -1)
        assert torch.allclose(layer(torch.cat((post, dual), -1), encoder_padding_mask=None), expected, atol=1e-5)
        started = layer(post, encoder_padding_mask=None)  # width d: the embeddings start x_dual = s x
        assert torch.allclose(started[..., D:], 0.05 * (post + a + f), atol=1e-6)
    assert layer.dual is None  # nothing kept after the forward


def test_dual_scale_is_005_in_half_precision_and_1_otherwise():
    ns = argparse.Namespace
    assert dual_scale(ns(fp16=True)) == dual_scale(ns(memory_efficient_fp16=True)) == 0.05
    assert dual_scale(ns(fp16=False, amp=True)) == dual_scale(ns()) == 1.0
    assert dual_scale(ns(fp16=True, residual_dual_scale=0.5)) == 0.5
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(LnposError, match="--residual-dual-scale must be a positive number"):
            dual_scale(ns(residual_dual_scale=bad))


def test_fp16_flag_sets_the_scale_and_logs_it(toy_data, caplog):
    with caplog.at_level(logging.INFO, logger="fairseq_lnpos.models.variant"):
        model, _, _ = build_model(toy_data, "transformer_residual_tiny", *SMALL, "--fp16")
    assert "ResiDual 3-2: dual stream scaled by 0.05" in caplog.text
    assert {layer.dual_scale for s in (model.encoder, model.decoder) for layer in s.layers} == {0.05}
    assert model.encoder.layer_norm.scale == model.decoder.layer_norm.scale == 0.05


def test_the_scale_changes_the_dual_streams_size_not_the_output(toy_data, residual, scaled):
    (one, task, _), (small, _, _) = residual, scaled  # same seed, same randomized norms
    src, prev = tokens(task, 2, 6, 5), tokens(task, 2, 5, 6)
    src_lengths = torch.full((2,), 6)
    with torch.no_grad():
        states = [m.encoder(src, src_lengths=src_lengths, return_all_hiddens=True)["encoder_states"][-1]
                  for m in (one, small)]
        assert torch.allclose(states[1][..., D:], 0.05 * states[0][..., D:], rtol=1e-4, atol=1e-6)
        outputs = [m(src, src_lengths, prev)[0] for m in (one, small)]
    assert torch.allclose(outputs[0], outputs[1], atol=1e-4)


def test_lnpos_norm_replaces_the_dual_streams_layernorm_too(toy_data):
    model, task, _ = residual_model(toy_data, "--lnpos-norm", "rmsnorm")
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.layer_norm.norm, torch.nn.RMSNorm) and stack.layer_norm.norm.eps == DUAL_NORM_EPS
    assert_encoder_is_the_formula(model, task)


def test_incremental_decoding_equals_the_full_forward(residual):
    model, task, _ = residual
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)


def test_activation_checkpointing_gives_the_same_gradients(toy_data):
    src_lengths = torch.full((2,), 6)
    grads = []
    for extra in ((), ("--checkpoint-activations",)):
        model, task, _ = residual_model(toy_data, "--dropout", 0, *extra, seed=2)
        model.train()
        assert all(hasattr(layer, "precheckpoint_forward") == bool(extra)  # fairseq's wrapper is on
                   for stack in (model.encoder, model.decoder) for layer in stack.layers)
        out = model(tokens(task, 2, 6, 7), src_lengths, tokens(task, 2, 5, 8))[0]
        out.float().pow(2).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert grads[0]["encoder.layers.0.fc1.weight"].abs().sum() > 0
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-6), name
