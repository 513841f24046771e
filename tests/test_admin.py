"""Admin: LN(w * x + F(x)), w from a profiling pass (by hand on a fixed batch), profiled once, kept in checkpoints."""
import logging
import math
import re

import pytest
import torch

from conftest import build_model, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.variants import SIZES, arch_name
from helpers import decode_both_ways, fairseq_generate, fairseq_train, ffn, tokens

NO_DROPOUT = ("--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0)
SMALL = ("--encoder-layers", 2, "--decoder-layers", 3)


def fixed_batch(task, seed=0):
    src, prev = tokens(task, 3, 7, seed), tokens(task, 3, 5, seed + 1)
    src[0, :3] = task.source_dictionary.pad()  # fairseq left-pads the source: padding counts in Var, as in Admin's code
    prev[:, 0] = task.target_dictionary.eos()
    return src, torch.tensor([4, 7, 7]), prev


def skips(model):
    """Every layer's ``w`` (one per sublayer)."""
    return [[layer.skip_weight(n).detach().clone() for n in layer.skip_names]
            for stack in (model.encoder, model.decoder) for layer in stack.layers]


def profile_once(model, batch):
    model.train()
    model(*batch)
    model.eval()


@pytest.fixture
def admin(toy_data):
    return build_model(toy_data, "transformer_admin_tiny", *SMALL, *NO_DROPOUT)


def test_every_size_is_a_transformer_admin_model():
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_lnpos.models.archs  # noqa: F401

    for size in SIZES:
        assert ARCH_MODEL_REGISTRY[arch_name("admin", size)].__name__ == "AdminTransformerModel"


def test_w_is_the_profiled_output_std_computed_by_hand(admin):
    model, task, _ = admin
    src, lengths, prev = fixed_batch(task)
    var = lambda t: float(t.var(unbiased=False))  # noqa: E731  (population variance over all elements)

    def sublayer(x, branch, r, ws, norm):
        ws.append(r)
        return norm(branch + r * x), math.sqrt(var(r * x) + var(branch))

    expected = []
    with torch.no_grad():
        enc, dec = model.encoder, model.decoder
        mask = src.eq(enc.padding_idx)
        x = (enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)).transpose(0, 1)
        r = 1.0
        for layer in enc.layers:
            ws = []
            x, r = sublayer(x, layer.self_attn(x, x, x, key_padding_mask=mask, need_weights=False)[0], r, ws,
                            layer.self_attn_layer_norm)
            x, r = sublayer(x, ffn(layer, x), r, ws, layer.final_layer_norm)
            expected.append(ws)
        y = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
        causal = torch.triu(torch.full((5, 5), float("-inf")), 1)
        r = 1.0
        for layer in dec.layers:
            ws = []
            y, r = sublayer(y, layer.self_attn(y, y, y, attn_mask=causal, need_weights=False)[0], r, ws,
                            layer.self_attn_layer_norm)
            y, r = sublayer(y, layer.encoder_attn(y, x, x, key_padding_mask=mask, static_kv=True,
                                                  need_weights=False)[0], r, ws, layer.encoder_attn_layer_norm)
            y, r = sublayer(y, ffn(layer, y), r, ws, layer.final_layer_norm)
            expected.append(ws)
    assert all(w == 1 for layer in skips(model) for s in layer for w in s.tolist())
    profile_once(model, (src, lengths, prev))
    got = skips(model)
    assert [len(ws) for ws in got] == [2, 2, 3, 3, 3]
    assert expected[1][0] > 1.2  # the recursion grows: a wrong formula cannot pass by w = 1
    for ws_got, ws_expected in zip(got, expected):
        for w, e in zip(ws_got, ws_expected):
            assert torch.allclose(w, torch.full_like(w, e), rtol=1e-5)


def test_profiling_runs_on_the_first_training_forward_only(admin, caplog):
    model, task, _ = admin
    with torch.no_grad():
        model(*fixed_batch(task))  # eval mode: no profiling
    assert model.admin_profile.tolist() == [0, 1] and all(s.eq(1).all() for layer in skips(model) for s in layer)
    with caplog.at_level(logging.INFO, logger="fairseq_lnpos.models.admin"):
        profile_once(model, fixed_batch(task))
        first = skips(model)
        profile_once(model, fixed_batch(task, seed=5))
    assert model.admin_profile.tolist() == [1, 1]
    assert all(torch.equal(a, b) for la, lb in zip(first, skips(model)) for a, b in zip(la, lb))
    logged = [r.getMessage() for r in caplog.records if "Admin: w profiled" in r.getMessage()]
    assert len(logged) == 1 and logged[0].startswith("Admin: w profiled on batch 1/1 (3 sentences): encoder 1.000 ")
    assert len(logged[0].split("; decoder ")[1].split()) == 9


def test_profile_if_due_profiles_in_training_mode_from_eval_mode_once(toy_data):
    model, task, _ = build_model(toy_data, "transformer_admin_tiny", *SMALL, seed=4)  # dropout 0.1
    torch.manual_seed(0)
    model.profile_if_due(*fixed_batch(task))
    assert not model.training and model.admin_profile.tolist() == [1, 1]
    once = skips(model)
    model.profile_if_due(*fixed_batch(task, seed=3))
    assert all(torch.equal(a, b) for la, lb in zip(once, skips(model)) for a, b in zip(la, lb))
    twin, _, _ = build_model(toy_data, "transformer_admin_tiny", *SMALL, seed=4)
    twin.train()
    torch.manual_seed(0)
    twin(*fixed_batch(task))  # the same dropout masks as in training mode
    assert all(torch.equal(a, b) for la, lb in zip(once, skips(twin)) for a, b in zip(la, lb))


def test_k_batches_average_the_squared_ratios(toy_data):
    runs = {}
    for k, seeds in ((1, [0]), (1, [7]), (2, [0, 7])):
        model, task, _ = build_model(toy_data, "transformer_admin_tiny", *SMALL, *NO_DROPOUT,
                                     "--admin-profile-batches", k, seed=2)
        for s in seeds:
            profile_once(model, fixed_batch(task, seed=s))
        runs[tuple(seeds)] = (skips(model), model.admin_profile.tolist())
    assert runs[(0, 7)][1] == [2, 2]
    for a, b, both in zip(runs[(0,)][0], runs[(7,)][0], runs[(0, 7)][0]):
        for wa, wb, w in zip(a, b, both):
            assert torch.allclose(w, ((wa ** 2 + wb ** 2) / 2).sqrt(), rtol=1e-5)
    assert not torch.allclose(runs[(0,)][0][1][0], runs[(7,)][0][1][0])  # the two batches differ


def test_zero_batches_keeps_w_one_and_a_negative_count_is_an_error(toy_data):
    model, task, _ = build_model(toy_data, "transformer_admin_tiny", *SMALL, "--admin-profile-batches", 0)
    profile_once(model, fixed_batch(task))
    assert all(s.eq(1).all() for layer in skips(model) for s in layer)
    with pytest.raises(LnposError, match="--admin-profile-batches must be 0 or more, got -1"):
        build_model(toy_data, "transformer_admin_tiny", *SMALL, "--admin-profile-batches", -1)


def test_profiled_w_survives_parameters_written_back_from_a_copy_taken_before(admin):
    # fairseq's --fp16 optimizer copies the parameters when it is built (before the first forward)
    # and writes its fp32 copies back into the model after every update
    model, task, _ = admin
    copies = [p.detach().clone() for p in model.parameters()]
    profile_once(model, fixed_batch(task))
    profiled = skips(model)
    with torch.no_grad():
        for p, c in zip(model.parameters(), copies):
            p.copy_(c)
    assert profiled[1][0][0] > 1.2
    assert all(torch.equal(a, b) for la, lb in zip(profiled, skips(model)) for a, b in zip(la, lb))
    assert {n for n, _ in model.named_parameters() if "skip" in n} == {
        f"{stack}.layers.{i}.{sub}_skip_delta" for stack, subs, n_layers in
        (("encoder", ["self_attn", "ffn"], 2), ("decoder", ["self_attn", "encoder_attn", "ffn"], 3))
        for i in range(n_layers) for sub in subs}


def set_random_skips(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            for layer in stack.layers:
                for n in layer.skip_names:
                    getattr(layer, f"{n}_init").copy_(0.5 + 2 * torch.rand(layer.embed_dim, generator=g))
                    getattr(layer, f"{n}_delta").copy_(0.1 * torch.randn(layer.embed_dim, generator=g))


def test_encoder_layer_is_ln_of_w_x_plus_sublayer_elementwise(admin):
    model, _, _ = admin
    set_random_skips(model)
    layer = model.encoder.layers[1]
    x = torch.randn(6, 2, 128)
    with torch.no_grad():
        w = {n: layer.skip_weight(n) for n in layer.skip_names}
        h = layer.self_attn_layer_norm(w["self_attn_skip"] * x + layer.self_attn(x, x, x, need_weights=False)[0])
        expected = layer.final_layer_norm(w["ffn_skip"] * h + ffn(layer, h))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_layer_is_ln_of_w_x_plus_sublayer_for_all_three_sublayers(admin):
    model, _, _ = admin
    set_random_skips(model)
    layer = model.decoder.layers[2]
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with torch.no_grad():
        w = {n: layer.skip_weight(n) for n in layer.skip_names}
        h = layer.self_attn_layer_norm(w["self_attn_skip"] * x + layer.self_attn(x, x, x, attn_mask=mask,
                                                                                 need_weights=False)[0])
        h = layer.encoder_attn_layer_norm(w["encoder_attn_skip"] * h + layer.encoder_attn(h, enc, enc,
                                                                                          need_weights=False)[0])
        expected = layer.final_layer_norm(w["ffn_skip"] * h + ffn(layer, h))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=mask)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_incremental_decoding_equals_the_full_forward(admin):
    model, task, _ = admin
    profile_once(model, fixed_batch(task))
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)


def test_a_reloaded_model_keeps_w_and_never_profiles_again(admin, toy_data, caplog):
    saved, task, _ = admin
    profile_once(saved, fixed_batch(task))
    loaded, _, _ = build_model(toy_data, "transformer_admin_tiny", *SMALL, *NO_DROPOUT, seed=9)
    loaded.load_state_dict(saved.state_dict())
    batch = fixed_batch(task, seed=3)
    with caplog.at_level(logging.INFO, logger="fairseq_lnpos.models.admin"):
        profile_once(loaded, batch)
    assert not [r for r in caplog.records if "profiled" in r.getMessage()]
    assert loaded.admin_profile.tolist() == [1, 1]
    assert all(torch.equal(a, b) for la, lb in zip(skips(saved), skips(loaded)) for a, b in zip(la, lb))
    with torch.no_grad():
        assert torch.equal(saved(*batch)[0], loaded(*batch)[0])


@pytest.mark.slow
def test_admin_trains_decodes_and_resumes_without_profiling_again(toy_data, tmp_path):
    log = fairseq_train(toy_data, tmp_path, "transformer_admin_tiny")
    profiled = re.findall(r"Admin: w profiled on batch 1/1 \(\d+ sentences\): encoder ([\d. ]+); decoder ([\d. ]+)",
                          log)
    assert len(profiled) == 1
    enc, dec = (list(map(float, s.split())) for s in profiled[0])
    assert len(enc) == 12 and len(dec) == 18 and enc[0] == dec[0] == 1.0 and enc[-1] > 1.2
    assert re.findall(r"num_updates=(\d+)", log) == ["1", "2"]
    assert "profiled" not in fairseq_generate(toy_data, tmp_path)
    resumed = fairseq_train(toy_data, tmp_path, "transformer_admin_tiny", updates=3)
    assert "Loaded checkpoint" in resumed and "profiled" not in resumed
    assert re.findall(r"num_updates=(\d+)", resumed) == ["3"]
