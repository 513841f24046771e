"""ReZero: x + a F(x) without LayerNorm; ReZero+Post-LN: LN(x + a F(x)); one a per layer, initialised to 0."""
import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn
from test_tfixup import is_layernorm

SMALL = ("--encoder-layers", 3, "--decoder-layers", 2)
NO_DROPOUT = ("--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0)


def set_random_a(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("rezero_weight"):
                p.copy_(0.5 + torch.rand(1, generator=g))


@pytest.fixture(scope="module", params=["rezero", "rezero_postln"])
def rezero(toy_data, request):
    model, task, _ = build_model(toy_data, arch_name(request.param, "tiny"), *SMALL)
    randomize_norms(model)
    set_random_a(model)
    return request.param, model, task


@pytest.mark.parametrize("variant", ["rezero", "rezero_postln"])
def test_one_a_per_layer_initialised_to_zero_in_every_size(toy_data, variant):
    for size in SIZES:
        model, _, _ = build_model(toy_data, arch_name(variant, size), *SMALL)
        a = {n: p for n, p in model.named_parameters() if "rezero" in n}
        assert sorted(a) == [f"{stack}.layers.{i}.rezero_weight"
                             for stack, n in (("decoder", 2), ("encoder", 3)) for i in range(n)]
        assert all(p.shape == (1,) and p.item() == 0 and p.requires_grad for p in a.values())
        has_ln = [n for n, m in model.named_modules() if is_layernorm(m)]
        if variant == "rezero":
            assert not has_ln
        else:
            assert len(has_ln) == 3 * 2 + 2 * 3 and model.encoder.layer_norm is None  # Post-LN: no final LN


def test_rezero_is_the_identity_at_initialisation(toy_data):
    model, task, _ = build_model(toy_data, "transformer_rezero_tiny", *SMALL, *NO_DROPOUT)
    src = torch.randint(4, len(task.source_dictionary), (2, 6))
    with torch.no_grad():
        out = model.encoder(src, src_lengths=torch.tensor([6, 6]))["encoder_out"][0]
        emb = model.encoder.forward_embedding(src)[0].transpose(0, 1)
    assert torch.equal(out, emb)


def test_rezero_refuses_layernorm_options(toy_data):
    with pytest.raises(LnposError, match="ReZero has no LayerNorm: drop --layernorm-embedding"):
        build_model(toy_data, "transformer_rezero_tiny", "--layernorm-embedding")
    with pytest.raises(LnposError, match="has no LayerNorm to replace"):
        build_model(toy_data, "transformer_rezero_tiny", "--lnpos-norm", "rmsnorm")


def post(layer, name, postln):
    return getattr(layer, name) if postln else (lambda x: x)


def test_encoder_layer_formula(rezero):
    variant, model, _ = rezero
    layer, postln = model.encoder.layers[1], variant == "rezero_postln"
    a = layer.rezero_weight.item()
    assert a > 0.4
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        h = post(layer, "self_attn_layer_norm", postln)(x + a * self_attn(layer, x))
        expected = post(layer, "final_layer_norm", postln)(h + a * ffn(layer, h))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_formula_one_a_for_all_three_sublayers(rezero):
    variant, model, _ = rezero
    layer, postln = model.decoder.layers[1], variant == "rezero_postln"
    a = layer.rezero_weight.item()
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    with torch.no_grad():
        h = post(layer, "self_attn_layer_norm", postln)(x + a * self_attn(layer, x, attn_mask=CAUSAL))
        h = post(layer, "encoder_attn_layer_norm", postln)(h + a * cross_attn(layer, h, enc))
        expected = post(layer, "final_layer_norm", postln)(h + a * ffn(layer, h))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=CAUSAL)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(rezero):
    _, model, task = rezero
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)
