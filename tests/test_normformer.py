"""NormFormer: Pre-LN with head scales, a LayerNorm after self-attention and one inside the FFN
(fairseq's --scale-heads --scale-attn --scale-fc, and --scale-resids on request), in both stacks."""
import copy

import pytest
import torch
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import CAUSAL, cross_attn, decode_both_ways, ffn, randomize_norms, self_attn, tokens

SMALL = ("--encoder-layers", 2, "--decoder-layers", 3)
NEW = {"attn_ln.weight", "attn_ln.bias", "c_attn", "ffn_layernorm.weight", "ffn_layernorm.bias"}


def randomize(model, seed=1):
    """Every normalization and every NormFormer scale random (all are 1 or 0 at initialisation)."""
    randomize_norms(model, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn_ln.weight", "c_attn", "w_resid")):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("attn_ln.bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def normformer(toy_data):
    model, task, args = build_model(toy_data, "transformer_normformer_tiny", *SMALL, "--scale-resids")
    randomize(model)
    return model, task, args


def heads(layer, a):
    """The attention output ``a`` with its slice of each head (head dim wide) times that head's scale."""
    t, b, d = a.shape
    return (a.view(t, b, layer.c_attn.numel(), -1) * layer.c_attn.view(-1, 1)).view(t, b, d)


def new_params(layer):
    return {n for n, _ in layer.named_parameters() if not n.startswith(("self_attn.", "encoder_attn.", "fc"))
            and not n.split(".")[0].endswith("layer_norm")}


@pytest.mark.parametrize("size", list(SIZES))
def test_every_size_is_pre_ln_with_the_normformer_options_in_both_stacks(toy_data, size):
    model, _, args = build_model(toy_data, arch_name("normformer", size), "--encoder-layers", 1, "--decoder-layers", 1)
    assert type(model).__name__ == "NormFormerTransformerModel"
    assert (args.scale_attn, args.scale_fc, args.scale_heads, getattr(args, "scale_resids", False)) == (True,) * 3 + (False,)
    assert isinstance(model.encoder.layer_norm, torch.nn.LayerNorm)
    assert isinstance(model.decoder.layer_norm, torch.nn.LayerNorm)
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert enc.normalize_before and dec.normalize_before
    assert new_params(enc) == new_params(dec) == NEW  # the encoder's are named as fairseq's decoder's
    assert enc.ffn_layernorm.normalized_shape == (args.encoder_ffn_embed_dim,)
    assert enc.c_attn.shape == (args.encoder_attention_heads,) and enc.w_resid is None is dec.w_resid
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in enc.named_parameters() if n in ("c_attn", "attn_ln.weight"))


def test_scale_resids_adds_w_resid_to_both_stacks(normformer):
    model, _, args = normformer
    assert args.scale_resids
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        assert new_params(layer) == NEW | {"w_resid"} and layer.w_resid.shape == (128,)


def test_encoder_layer_formula(normformer):
    model, _, _ = normformer
    layer = model.encoder.layers[1]
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        h = x + layer.attn_ln(heads(layer, self_attn(layer, layer.self_attn_layer_norm(x))))
        expected = layer.w_resid * h + ffn(layer, layer.final_layer_norm(h), layer.ffn_layernorm)
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_formula_nothing_new_on_cross_attention(normformer):
    model, _, _ = normformer
    layer = model.decoder.layers[2]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    with torch.no_grad():
        h = x + layer.attn_ln(heads(layer, self_attn(layer, layer.self_attn_layer_norm(x), attn_mask=CAUSAL)))
        h = h + cross_attn(layer, layer.encoder_attn_layer_norm(h), enc)
        expected = layer.w_resid * h + ffn(layer, layer.final_layer_norm(h), layer.ffn_layernorm)
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=CAUSAL)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def fairseq_cfg(args):
    """fairseq's config with the four NormFormer options on (fairseq's translation model has no flags for them)."""
    args = copy.deepcopy(args)
    args.scale_attn = args.scale_fc = args.scale_heads = args.scale_resids = True
    return args


def test_decoder_is_fairseqs_decoder_with_the_scale_options(normformer):
    model, task, args = normformer
    embed = TransformerModel.build_embedding(args, task.target_dictionary, args.decoder_embed_dim)
    theirs = TransformerModel.build_decoder(fairseq_cfg(args), task.target_dictionary, embed).eval()
    theirs.load_state_dict(model.decoder.state_dict())  # strict: the same parameters, names and shapes
    src, prev = tokens(task, 2, 6, 3), tokens(task, 2, 5, 4)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((2,), 6))
        assert torch.equal(model.decoder(prev, encoder_out=enc)[0], theirs(prev, encoder_out=enc)[0])


def test_encoder_layer_is_fairseqs_decoder_layer_without_cross_attention_dropout_included(toy_data):
    """The encoder's additions sit where fairseq's decoder has them: with the same weights, the
    same dropout masks and no causal mask, the two layers compute the same."""
    model, _, args = build_model(toy_data, "transformer_normformer_tiny", *SMALL, "--scale-resids",
                                 "--dropout", 0.3, "--activation-dropout", 0.2)
    randomize(model)
    ours = model.encoder.layers[0].train()
    theirs = TransformerDecoderLayerBase(TransformerConfig.from_namespace(fairseq_cfg(args)), no_encoder_attn=True)
    theirs.load_state_dict(ours.state_dict())
    theirs.train()
    x, pad = torch.randn(6, 2, 128), torch.zeros(2, 6, dtype=torch.bool)
    pad[0, :2] = True
    with torch.no_grad():
        torch.manual_seed(5)
        got = ours(x, encoder_padding_mask=pad)
        torch.manual_seed(5)
        expected = theirs(x, self_attn_padding_mask=pad)[0]
    assert torch.allclose(got, expected, atol=1e-6)


def test_lnpos_norm_replaces_the_new_layernorms_too(toy_data):
    model, _, _ = build_model(toy_data, "transformer_normformer_tiny", *SMALL, "--lnpos-norm", "rmsnorm")
    randomize(model)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        assert isinstance(layer.attn_ln, torch.nn.RMSNorm) and isinstance(layer.ffn_layernorm, torch.nn.RMSNorm)
    assert layer.ffn_layernorm.normalized_shape == (512,)
    layer = model.encoder.layers[0]
    x = torch.randn(6, 2, 128)
    with torch.no_grad():
        h = x + layer.attn_ln(heads(layer, self_attn(layer, layer.self_attn_layer_norm(x))))
        assert torch.allclose(layer(x, encoder_padding_mask=None), h + ffn(layer, layer.final_layer_norm(h), layer.ffn_layernorm), atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(normformer):
    model, task, _ = normformer
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)
