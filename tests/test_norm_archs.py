"""ScaleNorm + FixNorm (``transformer_scalenorm``), Sub-LN (``transformer_subln``) and the Pre-LN archs
with another normalization (``transformer_dyt``, ``_derf``, ``_preln_rmsnorm``): block formulas by hand,
initialization, incremental decoding, fairseq-train + fairseq-generate."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import USER_DIR, build_model, fairseq_cmd, run, toy_data  # noqa: F401
from fairseq_lnpos.models.norms import ScaleNorm
from fairseq_lnpos.models.subln import subln_gammas
from helpers import decode_both_ways, ffn, generated_bleu

NO_DROPOUT = ("--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0)
NEW_ARCHS = ["scalenorm", "subln", "dyt", "derf", "preln_rmsnorm"]


def attention_by_hand(attn, h):
    """fairseq's self-attention core (before out_proj) on T x B x C input, no mask, no dropout."""
    t, b, c = h.shape
    heads = attn.num_heads
    split = lambda y: y.reshape(t, b * heads, c // heads).transpose(0, 1)  # noqa: E731
    q, k, v = split(attn.q_proj(h) * attn.scaling), split(attn.k_proj(h)), split(attn.v_proj(h))
    core = torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
    return core.transpose(0, 1).reshape(t, b, c)


def test_scalenorm_module_formula():
    norm = ScaleNorm(16)
    assert norm.weight.item() == pytest.approx(4.0)  # sqrt(d)
    x = torch.randn(3, 2, 16) * 5
    assert torch.allclose(norm(x), 4.0 * x / x.norm(dim=-1, keepdim=True), atol=1e-6)


@pytest.mark.parametrize("share", [(), ("--share-decoder-input-output-embed",)])
def test_scalenorm_fixnorm_smallinit(toy_data, share):
    model, task, args = build_model(toy_data, "transformer_scalenorm_tiny", *share, *NO_DROPOUT)
    d, d_ffn = 128, 512
    norms = [m for m in model.modules() if isinstance(m, ScaleNorm)]
    assert len(norms) == 6 * 2 + 1 + 6 * 3 + 1 and all(n.weight.item() == pytest.approx(math.sqrt(d)) for n in norms)
    # SmallInit: attention N(0, 2/(5d)), FFN N(0, 2/(d+d_ff)), biases 0
    layer = model.decoder.layers[0]
    for proj in (layer.encoder_attn.q_proj, layer.self_attn.out_proj):
        assert float(proj.weight.std()) == pytest.approx(math.sqrt(2 / (5 * d)), rel=0.05)
        assert torch.equal(proj.bias, torch.zeros(d))
    assert float(layer.fc1.weight.std()) == pytest.approx(math.sqrt(2 / (d + d_ffn)), rel=0.05)
    assert torch.equal(layer.fc2.bias, torch.zeros(d))
    # FixNorm at the input: unit-length rows (times fairseq's sqrt(d) scale), the padding row 0
    tokens = torch.tensor([[5, 6, 7, task.source_dictionary.pad()]])
    looked_up = model.encoder.embed_tokens(tokens)
    assert torch.allclose(looked_up[0, :3].norm(dim=-1), torch.ones(3), atol=1e-5)
    assert torch.equal(looked_up[0, 3], torch.zeros(d))
    # ... and in the output projection, tied or not
    feats = torch.randn(2, 3, d)
    weight = model.decoder.output_projection.weight
    assert (weight is model.decoder.embed_tokens.weight) == bool(share)
    bias = model.decoder.output_projection.bias
    assert torch.equal(bias, torch.zeros(len(task.target_dictionary)))  # use_bias, initialised to 0
    with torch.no_grad():
        bias.normal_()
    assert torch.allclose(model.decoder.output_layer(feats), feats @ F.normalize(weight, dim=-1).T + bias, atol=1e-5)
    # Pre-LN with ScaleNorm: an encoder layer by hand
    enc = model.encoder.layers[0]
    x = torch.randn(5, 2, d) * 3
    h = enc.self_attn_layer_norm(x)
    x1 = x + enc.self_attn.out_proj(attention_by_hand(enc.self_attn, h))
    y = x1 + ffn(enc, enc.final_layer_norm(x1))
    with torch.no_grad():
        assert torch.allclose(enc(x, None), y, atol=2e-4)


def test_scalenorm_language_embedding_is_added_to_every_input_token(toy_data):
    """The official get_input: sqrt(d) e / ||e|| + the language's vector + the position, the source
    language's row in the encoder, the target's in the decoder, one (2, d) table N(0, d^-1/2)."""
    from fairseq.modules import SinusoidalPositionalEmbedding
    from fairseq.utils import make_positions

    model, task, _ = build_model(toy_data, "transformer_scalenorm_tiny", *NO_DROPOUT)
    d, lang = 128, model.lang_embedding
    assert lang.shape == (2, d) and "lang_embedding" in model.state_dict()
    assert float(lang.std()) == pytest.approx(d ** -0.5, rel=0.2) and abs(float(lang.mean())) < 0.3 * d ** -0.5
    seen = {}
    for side in ("encoder", "decoder"):
        getattr(model, side).layers[0].register_forward_pre_hook(lambda m, a, side=side: seen.setdefault(side, a[0]))
    pad = task.source_dictionary.pad()
    src = torch.tensor([[5, 6, 7, 8, 2], [pad, pad, 9, 10, 2]])
    prev = torch.tensor([[2, 11, 12], [2, 13, pad]])
    out, _ = model(src, torch.tensor([5, 3]), prev)

    def by_hand(stack, tokens, row):
        sinus = SinusoidalPositionalEmbedding.get_embedding(64, d, pad)[make_positions(tokens, pad)]
        x = math.sqrt(d) * F.normalize(stack.embed_tokens.weight[tokens], dim=-1) + sinus + lang[row]
        return x.transpose(0, 1)

    kept = src.ne(pad).T.unsqueeze(-1)  # fairseq's encoder zeroes its padding positions
    assert torch.allclose(seen["encoder"], by_hand(model.encoder, src, 0) * kept, atol=1e-5)
    assert torch.allclose(seen["decoder"], by_hand(model.decoder, prev, 1), atol=1e-5)
    # learned: both rows get a gradient, and the output bias
    out.float().logsumexp(-1).sum().backward()
    assert all(float(g.abs().sum()) > 0 for g in lang.grad) and float(model.decoder.output_projection.bias.grad.abs().sum()) > 0


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_subln_block_by_hand(toy_data, mode):
    model, _, _ = build_model(toy_data, "transformer_subln_tiny", *NO_DROPOUT)
    getattr(model, mode)()  # train: fairseq would take torch's fused attention, which skips out_proj
    d = 128
    for layer in (model.encoder.layers[2], model.decoder.layers[0]):
        assert layer.self_attn_sub_layer_norm.normalized_shape == (d,)
        assert layer.ffn_sub_layer_norm.normalized_shape == (512,)
    enc = model.encoder.layers[2]
    x = torch.randn(5, 2, d) * 3
    core = attention_by_hand(enc.self_attn, enc.self_attn_layer_norm(x))
    x1 = x + enc.self_attn.out_proj(enc.self_attn_sub_layer_norm(core))
    y = x1 + ffn(enc, enc.final_layer_norm(x1), enc.ffn_sub_layer_norm)
    with torch.no_grad():
        assert torch.allclose(enc(x, None), y, atol=2e-4)


def test_subln_init_is_the_papers_xavier_normal_with_gain_gamma(toy_data):
    n, m = 3, 2
    model, _, _ = build_model(toy_data, "transformer_subln_tiny", "--encoder-layers", n, "--decoder-layers", m,
                              "--lnpos-init", "fairseq-0.8")
    gammas = subln_gammas(n, m)
    assert gammas["encoder"] == pytest.approx(math.sqrt(math.log(3 * m) * math.log(2 * n) / 3))
    assert subln_gammas(6, 6) == pytest.approx({"encoder": 1.5473, "decoder": 1.7001}, abs=1e-4)
    d, d_ffn = 128, 512
    xavier = lambda fan_in, fan_out, gain=1.0: gain * math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    for side in ("encoder", "decoder"):
        g = gammas[side]
        for layer in getattr(model, side).layers:
            assert float(layer.fc1.weight.std()) == pytest.approx(g * xavier(d, d_ffn), rel=0.05)
            assert float(layer.fc2.weight.std()) == pytest.approx(g * xavier(d_ffn, d), rel=0.05)
            # every attention, the decoder's cross-attention included (torchscale skips it)
            for attn in [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else []):
                for w in (attn.v_proj.weight, attn.out_proj.weight):
                    assert float(w.std()) == pytest.approx(g * xavier(d, d), rel=0.05)
                for w in (attn.q_proj.weight, attn.k_proj.weight):  # gain 1, not fairseq's 2^-1/2
                    assert float(w.std()) == pytest.approx(xavier(d, d), rel=0.05)
                # normal, not uniform: a uniform's largest value is sqrt(3) std
                assert float(attn.v_proj.weight.abs().max()) > 2.5 * g * xavier(d, d)
            # biases are --lnpos-init's (fairseq-0.8: zero), not scaled
            assert float(layer.fc1.bias.abs().max()) == 0.0
            assert float(layer.self_attn.v_proj.bias.abs().max()) == 0.0
    assert not hasattr(model.decoder.layers[0], "encoder_attn_sub_layer_norm")


@pytest.mark.parametrize("variant", NEW_ARCHS)
def test_incremental_decoding_equals_the_full_forward(toy_data, variant):
    model, task, _ = build_model(toy_data, f"transformer_{variant}_tiny", "--encoder-layers", 2, "--decoder-layers", 2)
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["scalenorm", "subln", "dyt"])
def test_trains_and_decodes_with_fairseq(toy_data, tmp_path, variant):
    common = ["--user-dir", USER_DIR, "--cpu"]
    train = run(fairseq_cmd(
        "fairseq-train", toy_data, *common, "--arch", f"transformer_{variant}_tiny", "--optimizer", "adam",
        "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "1", "--max-tokens", "1000",
        "--encoder-layers", "2", "--decoder-layers", "2",
        "--max-update", "2", "--save-dir", tmp_path, "--no-progress-bar", "--log-interval", "1",
    ))
    log = train.stdout + train.stderr
    assert train.returncode == 0, log[-3000:]
    assert re.findall(r"num_updates=(\d+)", log) == ["1", "2"]
    gen = run(fairseq_cmd("fairseq-generate", toy_data, *common, "--path", tmp_path / "checkpoint_last.pt",
                          "--beam", "2", "--max-len-a", "1", "--max-len-b", "3", "--batch-size", "64"))
    assert gen.returncode == 0, gen.stderr[-3000:]
    generated_bleu(gen.stdout)
