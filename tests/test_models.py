"""The architectures: registration, where LayerNorm sits, equality with fairseq's transformer."""
import pytest
import torch

from conftest import build_model, fairseq_cmd, run, same_state, toy_data, two_layers  # noqa: F401
from fairseq_lnpos.gradnorm import is_inference_copy
from fairseq_lnpos.variants import VARIANTS, arch_names

ALL_ARCHS = sorted(arch_names())


def batch(task, bsz=3, src_len=7, tgt_len=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    nspecial = task.source_dictionary.nspecial
    n = len(task.source_dictionary)
    src = torch.randint(nspecial, n, (bsz, src_len), generator=g)
    prev = torch.randint(nspecial, n, (bsz, tgt_len), generator=g)
    prev[:, 0] = task.target_dictionary.eos()
    return src, torch.full((bsz,), src_len), prev


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_every_arch_builds_runs_forward_and_backward(toy_data, arch):
    small = [] if arch.endswith("_tiny") else two_layers(arch)
    model, task, args = build_model(toy_data, arch, *small)
    expected_dim = 128 if arch.endswith("_tiny") else 512
    assert args.encoder_embed_dim == expected_dim
    if arch.endswith("_iwslt_de_en"):
        assert (args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (1024, 4)
    if arch.endswith("_tiny"):
        assert (args.encoder_layers, args.decoder_layers, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (6, 6, 512, 4)
    model.train()
    src, lengths, prev = batch(task)
    logits, _ = model(src, lengths, prev)
    assert logits.shape == (3, 5, len(task.target_dictionary))
    logits.logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad and not is_inference_copy(n)}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())


def layer_outputs(model, task):
    """Per-layer outputs of the encoder and decoder, and what enters each stack's final LN."""
    outs = {"encoder": [], "decoder": []}
    hooks = [
        layer.register_forward_hook(lambda m, i, o, side=side: outs[side].append(o[0] if isinstance(o, tuple) else o))
        for side in outs
        for layer in getattr(model, side).layers
    ]
    with torch.no_grad():
        model(*batch(task, bsz=4, src_len=20, tgt_len=20))
    for h in hooks:
        h.remove()
    return outs


def test_postln_layer_outputs_are_layernormed_and_there_is_no_final_ln(toy_data):
    model, task, args = build_model(toy_data, "transformer_postln_tiny")
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    d = args.encoder_embed_dim
    for side, outs in layer_outputs(model, task).items():
        assert len(outs) == 6
        for x in outs:  # LayerNorm with gamma 1, beta 0 at init: squared norm d at every position
            assert torch.allclose((x ** 2).sum(-1), torch.full(x.shape[:2], float(d)), rtol=1e-3)


def test_preln_has_final_layernorm_and_residual_stream_grows_with_depth(toy_data):
    model, task, args = build_model(toy_data, "transformer_preln_tiny")
    assert isinstance(model.encoder.layer_norm, torch.nn.LayerNorm)
    assert isinstance(model.decoder.layer_norm, torch.nn.LayerNorm)
    assert all(layer.normalize_before for layer in list(model.encoder.layers) + list(model.decoder.layers))
    d = args.encoder_embed_dim
    for side, outs in layer_outputs(model, task).items():
        sq = [float((x ** 2).sum(-1).mean()) / d for x in outs]
        assert all(b > a for a, b in zip(sq, sq[1:])), (side, sq)  # paper Lemma 2: grows linearly in l
        assert sq[-1] > 1.5 * sq[0]


@pytest.mark.parametrize("variant,task", [(v, "translation_lnpos") for v in VARIANTS]
                         + [(v, "translation") for v in ("deepnorm", "keel")])
def test_a_reloaded_model_computes_what_the_saved_one_did(toy_data, variant, task):
    # loading a state dict is what fairseq-generate does; upstream fairseq 0.12.2 then switches a
    # Post-LN encoder layer in eval mode to a fused plain-Post-LN kernel, which must not happen
    # to DeepNorm's scaled skip or Keel's extra LayerNorms, and which fails on padded batches
    # with torch >= 2.0 (fairseq's own Post-LN: avoided by the plugin's task)
    small = two_layers(f"transformer_{variant}_tiny") + ("--task", task)
    saved, task, _ = build_model(toy_data, f"transformer_{variant}_tiny", *small, seed=3)
    loaded, _, _ = build_model(toy_data, f"transformer_{variant}_tiny", *small, seed=4)
    src, lengths, prev = batch(task)
    src[0, :2] = task.source_dictionary.pad()  # left padding, as fairseq batches the source
    assert not torch.equal(saved(src, lengths, prev)[0], loaded(src, lengths, prev)[0])
    loaded.load_state_dict(saved.state_dict())
    with torch.no_grad():
        assert torch.equal(saved(src, lengths, prev)[0], loaded(src, lengths, prev)[0])


@pytest.mark.parametrize("variant,flags", [
    ("preln", ["--encoder-normalize-before", "--decoder-normalize-before"]),
    ("postln", []),
])
def test_equal_to_fairseq_transformer_with_the_same_seed(toy_data, variant, flags):
    ours, task, _ = build_model(toy_data, f"transformer_{variant}_iwslt_de_en", seed=7)
    theirs, _, _ = build_model(toy_data, "transformer_iwslt_de_en", *flags, seed=7)
    a, b = ours.state_dict(), theirs.state_dict()
    assert same_state(a, b)
    with torch.no_grad():
        out_ours, out_theirs = ours(*batch(task))[0], theirs(*batch(task))[0]
    assert torch.equal(out_ours, out_theirs)


def test_variant_name_overrides_normalize_before_flags(toy_data):
    model, _, args = build_model(toy_data, "transformer_postln_tiny", "--encoder-normalize-before")
    assert args.encoder_normalize_before is False and model.encoder.layer_norm is None


def test_user_options_work_as_with_fairseq(toy_data):
    model, _, args = build_model(
        toy_data, "transformer_deepnorm_tiny", "--encoder-layers", 3, "--decoder-layers", 2,
        "--encoder-embed-dim", 64, "--decoder-embed-dim", 64, "--dropout", 0.3, "--share-all-embeddings",
    )
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (3, 2)
    assert model.encoder.embed_tokens is model.decoder.embed_tokens
    assert model.encoder.layers[0].dropout_module.p == 0.3
    assert model.encoder.layers[0].fc1.weight.shape == (512, 64)


@pytest.mark.parametrize("arch,flag", [
    ("transformer_deepnorm_tiny", "--encoder-layers"),
    ("transformer_postln_tiny", "--decoder-layers"),
])
@pytest.mark.slow
def test_zero_layers_is_a_one_line_error(toy_data, arch, flag):
    result = run(fairseq_cmd("fairseq-train", toy_data, "--user-dir", __import__("conftest").USER_DIR,
                             "--arch", arch, flag, "0", "--max-update", "1", "--cpu"))
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert f"{flag} must be at least 1" in last and "Traceback" not in result.stderr


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_layer_calls_its_residual_connection_once_per_sublayer(toy_data, variant):
    """The contract of models/sublayers.py that --log-diagnostics' residual_ratio names its calls by:
    each layer's forward calls ``residual_connection`` once per sublayer (self_attn, encoder_attn, ffn)."""
    from fairseq_lnpos.diagnostics import residual_layers
    from fairseq_lnpos.models.sublayers import sublayer_names

    arch = f"transformer_{variant}"
    model, task, _ = build_model(toy_data, arch, *two_layers(arch))
    calls = {}
    for name, layer in residual_layers(model):
        def counted(x, residual, name=name, original=layer.residual_connection):
            calls[name] = calls.get(name, 0) + 1
            return original(x, residual)
        layer.residual_connection = counted
    model(*batch(task))
    assert calls == {name: len(sublayer_names(layer)) for name, layer in residual_layers(model)}
