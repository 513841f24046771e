"""``--lnpos-norm``: what every LayerNorm of a model becomes (RMSNorm, DyT, Derf), and the archs that
fix it (``transformer_preln_rmsnorm``, ``transformer_dyt``, ``transformer_derf``)."""
import pytest
import torch
from torch import nn

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.models.norms import Derf, DyT, ScaleNorm, is_layer_norm

SMALL = ("--encoder-layers", 2, "--decoder-layers", 2)
KINDS = {"rmsnorm": nn.RMSNorm, "dyt": DyT, "derf": Derf, "scalenorm": ScaleNorm}


def norm_modules(model):
    """name -> module for every normalization module of the model."""
    return {n: m for n, m in model.named_modules() if is_layer_norm(m) or isinstance(m, tuple(KINDS.values()))}


def build(toy_data, arch, *extra, seed=1):
    return build_model(toy_data, arch, *SMALL, *extra, seed=seed)[0]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("variant,extra", [
    ("postln", ("--layernorm-embedding",)), ("preln", ()), ("deepnorm", ()), ("keel", ()), ("admin", ()),
])
def test_every_layernorm_is_replaced_and_nothing_else_changes(toy_data, variant, extra, kind):
    arch = f"transformer_{variant}_tiny"
    ln_model = build(toy_data, arch, *extra, seed=3)
    model = build(toy_data, arch, *extra, "--lnpos-norm", kind, seed=3)
    before, after = norm_modules(ln_model), norm_modules(model)
    assert before and all(is_layer_norm(m) for m in before.values())
    assert list(after) == list(before)  # the same places, under the same names
    assert all(type(m) is KINDS[kind] for m in after.values())
    # every other parameter is the same tensor as in the LayerNorm model (no randomness consumed)
    norm_prefixes = tuple(name + "." for name in before)
    a = {k: v for k, v in ln_model.state_dict().items() if not k.startswith(norm_prefixes)}
    b = {k: v for k, v in model.state_dict().items() if not k.startswith(norm_prefixes)}
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a if not k.endswith("_float_tensor"))


def test_the_modules_compute_their_formulas():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 16) * 3
    dyt, derf = DyT(16, alpha=0.7), Derf(16, alpha=0.4)
    for m in (dyt, derf):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.3)
    expected = dyt.weight * torch.tanh(dyt.alpha * x) + dyt.bias
    assert torch.allclose(dyt(x), expected, atol=1e-6)
    expected = derf.weight * torch.erf(derf.alpha * x + derf.shift) + derf.bias
    assert torch.allclose(derf(x), expected, atol=1e-6)
    assert DyT(4).alpha.item() == 0.5 and Derf(4).alpha.item() == 0.5 and Derf(4).shift.item() == 0


def test_rmsnorm_keeps_the_layernorm_eps_and_computes_rms(toy_data):
    model = build(toy_data, "transformer_preln_tiny", "--lnpos-norm", "rmsnorm")
    norm = model.encoder.layers[0].self_attn_layer_norm
    assert norm.eps == 1e-5
    x = torch.randn(4, 2, 128)
    assert torch.allclose(norm(x), x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5), atol=1e-6)


def test_alpha_option_sets_the_initial_alpha(toy_data):
    model = build(toy_data, "transformer_dyt_tiny", "--lnpos-norm-alpha", "0.2")
    alphas = [m.alpha.item() for m in norm_modules(model).values()]
    assert len(alphas) == (2 * 2 + 1) + (2 * 3 + 1) and alphas == pytest.approx([0.2] * len(alphas))


@pytest.mark.parametrize("arch,kind", [("transformer_dyt_tiny", DyT), ("transformer_derf_tiny", Derf),
                                       ("transformer_preln_rmsnorm_tiny", nn.RMSNorm)])
def test_named_archs_are_preln_with_their_normalization(toy_data, arch, kind):
    model = build(toy_data, arch, "--lnpos-norm", "layernorm")  # the arch's name wins, as for --*-normalize-before
    assert all(layer.normalize_before for layer in list(model.encoder.layers) + list(model.decoder.layers))
    assert isinstance(model.encoder.layer_norm, kind) and isinstance(model.decoder.layer_norm, kind)
    assert {type(m) for m in norm_modules(model).values()} == {kind}
    # Pre-LN's residual stream: the layer input is not normalized, each sublayer sees its norm's output
    layer = model.encoder.layers[0]
    x = torch.randn(6, 2, 128) * 4
    seen = {}
    hook = layer.self_attn.register_forward_pre_hook(lambda m, a, kw: seen.update(q=kw["query"]), with_kwargs=True)
    with torch.no_grad():
        layer(x, None)
    hook.remove()
    assert torch.allclose(seen["q"], layer.self_attn_layer_norm(x))


def test_tfixup_has_no_layernorm_to_replace(toy_data):
    with pytest.raises(LnposError, match="has no LayerNorm to replace"):
        build(toy_data, "transformer_tfixup_tiny", "--lnpos-norm", "dyt")


@pytest.mark.parametrize("alpha", ["0", "-1", "inf", "nan", "1e39", "65505"])
def test_bad_alpha_is_refused(toy_data, alpha):
    with pytest.raises(LnposError, match=r"--lnpos-norm-alpha must be in \(0, 65504\], got"):
        build(toy_data, "transformer_dyt_tiny", "--lnpos-norm-alpha", alpha)
