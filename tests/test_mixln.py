"""Mix-LN: the first floor(alpha L) layers of each stack Post-LN, the rest Pre-LN, final LN per stack."""
import logging

import pytest
import torch

from conftest import build_model, same_state, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn
from test_models import batch

SMALL = ("--encoder-layers", 8, "--decoder-layers", 4)


@pytest.fixture(scope="module")
def mixln(toy_data):
    model, task, args = build_model(toy_data, "transformer_mixln_tiny", *SMALL)
    randomize_norms(model)
    return model, task, args


def placements(model):
    return [[layer.normalize_before for layer in stack.layers] for stack in (model.encoder, model.decoder)]


def test_the_first_quarter_of_each_stack_is_post_ln_by_default(mixln, toy_data, caplog):
    model, _, _ = mixln
    assert placements(model) == [[False] * 2 + [True] * 6, [False] + [True] * 3]
    assert all(isinstance(stack.layer_norm, torch.nn.LayerNorm) for stack in (model.encoder, model.decoder))
    with caplog.at_level(logging.INFO, logger="fairseq_lnpos.models.mixln"):
        tiny, _, _ = build_model(toy_data, "transformer_mixln_tiny")
    assert placements(tiny) == [[False] + [True] * 5] * 2  # floor(0.25 x 6) = 1
    assert "Mix-LN 6-6: Post-LN layers 1 of 6 (encoder), 1 of 6 (decoder), the rest Pre-LN" in caplog.text


@pytest.mark.parametrize("ratio,expected", [("0.5", [4, 2]), ("0.9", [7, 3]), ("0.3", [2, 1])])
def test_post_ratio_sets_the_share(toy_data, ratio, expected):
    model, _, _ = build_model(toy_data, "transformer_mixln_tiny", *SMALL, "--mixln-post-ratio", ratio)
    assert [p.count(False) for p in placements(model)] == expected
    assert all(p == sorted(p) for p in placements(model))  # Post-LN first


@pytest.mark.parametrize("ratio", ["-0.1", "1.5", "nan"])
def test_a_ratio_outside_0_1_is_an_error(toy_data, ratio):
    with pytest.raises(LnposError, match="--mixln-post-ratio must be between 0 and 1"):
        build_model(toy_data, "transformer_mixln_tiny", "--mixln-post-ratio", ratio)


@pytest.mark.parametrize("ratio,layers,message", [
    ("0.25", 2, "--mixln-post-ratio 0.25 makes 0 of the 2 encoder layers Post-LN, so that stack has no Post-LN "
                "layer and is Pre-LN, not Mix-LN"),
    ("0", 6, "makes 0 of the 6 encoder layers Post-LN"),
    ("1", 6, "makes 6 of the 6 encoder layers Post-LN, so that stack has no Pre-LN layer and is Post-LN with a final "
             "LayerNorm, not Mix-LN")])
def test_a_stack_of_one_placement_only_is_refused(toy_data, ratio, layers, message):
    """It would be labelled Mix-LN in every table and map while being another variant."""
    with pytest.raises(LnposError) as e:
        build_model(toy_data, "transformer_mixln_tiny", "--encoder-layers", layers, "--mixln-post-ratio", ratio)
    assert str(e.value).startswith("transformer_mixln_tiny: --mixln-post-ratio ") and message in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(LnposError, match="0 of the 3 decoder layers"):  # each stack counts
        build_model(toy_data, "transformer_mixln_tiny", "--decoder-layers", 3)


def test_ratio_0_is_fairseqs_pre_ln_transformer(toy_data, monkeypatch):
    """The layers are fairseq's own: with the refusal above lifted, ratio 0 gives its Pre-LN model."""
    from fairseq_lnpos.models.mixln import MixLNTransformerModel

    monkeypatch.setattr(MixLNTransformerModel, "same_as_another", classmethod(lambda cls, args: None))
    ours, task, _ = build_model(toy_data, arch_name("mixln", "iwslt_de_en"), "--mixln-post-ratio", 0, seed=7)
    theirs, _, _ = build_model(toy_data, "transformer_iwslt_de_en", "--encoder-normalize-before",
                               "--decoder-normalize-before", seed=7)
    assert same_state(ours.state_dict(), theirs.state_dict())
    with torch.no_grad():
        assert torch.equal(ours(*batch(task))[0], theirs(*batch(task))[0])


def test_every_size_builds_as_mix_ln(toy_data):
    for size in SIZES:
        model, _, _ = build_model(toy_data, arch_name("mixln", size), "--encoder-layers", 4, "--decoder-layers", 4)
        assert type(model).__name__ == "MixLNTransformerModel" and placements(model)[0] == [False] + [True] * 3


@pytest.mark.parametrize("index", [1, 2])
def test_encoder_layer_is_post_ln_then_pre_ln(mixln, index):
    model, _, _ = mixln
    layer = model.encoder.layers[index]
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        if index < 2:
            h = layer.self_attn_layer_norm(x + self_attn(layer, x))
            expected = layer.final_layer_norm(h + ffn(layer, h))
        else:
            h = x + self_attn(layer, layer.self_attn_layer_norm(x))
            expected = h + ffn(layer, layer.final_layer_norm(h))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("index", [0, 3])
def test_decoder_layer_is_post_ln_then_pre_ln_for_all_three_sublayers(mixln, index):
    model, _, _ = mixln
    layer = model.decoder.layers[index]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    with torch.no_grad():
        if index == 0:
            h = layer.self_attn_layer_norm(x + self_attn(layer, x, attn_mask=CAUSAL))
            h = layer.encoder_attn_layer_norm(h + cross_attn(layer, h, enc))
            expected = layer.final_layer_norm(h + ffn(layer, h))
        else:
            h = x + self_attn(layer, layer.self_attn_layer_norm(x), attn_mask=CAUSAL)
            h = h + cross_attn(layer, layer.encoder_attn_layer_norm(h), enc)
            expected = h + ffn(layer, layer.final_layer_norm(h))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=CAUSAL)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(mixln):
    model, task, _ = mixln
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)
