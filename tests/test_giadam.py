"""GI-Adam (``--optimizer giadam``): v_0 = g_1^2, then Adam's own recursion."""
import copy
import os

import pytest
import torch
from fairseq.optim import build_optimizer
from omegaconf import OmegaConf

import fairseq_lnpos
from conftest import USER_DIR, fairseq_cmd, run
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.optim.giadam import GIAdam

fairseq_lnpos.register()

B1, B2, EPS, LR = 0.9, 0.98, 1e-8, 1e-2


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def loss(ps, step):
    return sum(((p - 0.3 * step) ** 2).sum() + 0.05 * p.pow(4).sum() for p in ps)


def step_each(step, *pairs):
    """One update of every (parameters, optimizer) pair on the loss of ``step``."""
    for ps, opt in pairs:
        opt.zero_grad()
        loss(ps, step).backward()
        opt.step()


def test_first_step_is_the_formula_by_hand():
    ps = params()
    before = [p.detach().clone() for p in ps]
    opt = GIAdam(ps, lr=LR, betas=(B1, B2), eps=EPS)
    loss(ps, 0).backward()
    grads = [p.grad.clone() for p in ps]
    opt.step()
    for p, w, g in zip(ps, before, grads):
        # v_0 = g^2 -> v_1 = g^2, m_1 = (1 - b1) g; corrected: m_hat = g, v_hat = g^2 / (1 - b2)
        m_hat, v_hat = (1 - B1) * g / (1 - B1), (B2 * g * g + (1 - B2) * g * g) / (1 - B2)
        expected = w - LR * m_hat / (v_hat.sqrt() + EPS)
        assert torch.allclose(p.detach(), expected, rtol=1e-6, atol=1e-9)
        # sqrt(1 - b2) of Adam's first step (which moves every weight by lr)
        assert torch.allclose((w - p.detach()).abs(), torch.full_like(w, LR * (1 - B2) ** 0.5), rtol=1e-4)
        assert torch.allclose(opt.state[p]["exp_avg_sq"], g * g, rtol=1e-6)


def test_later_steps_are_adams_recursion_from_the_prefilled_state():
    """From step 2 on GI-Adam is torch's Adam: an Adam whose state after step 1 is GI-Adam's follows
    it step for step."""
    ours, ref = params(), params()
    opt = GIAdam(ours, lr=LR, betas=(B1, B2), eps=EPS)
    adam = torch.optim.Adam(ref, lr=LR, betas=(B1, B2), eps=EPS)
    loss(ours, 0).backward()
    opt.step()
    with torch.no_grad():
        for a, b in zip(ours, ref):
            b.copy_(a)
    adam.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict would share the tensors
    for step in range(1, 8):
        step_each(step, (ours, opt), (ref, adam))
        assert all(torch.equal(a, b) for a, b in zip(ours, ref)), step
    # ... and differs from Adam started from v_0 = 0
    plain = params()
    adam0 = torch.optim.Adam(plain, lr=LR, betas=(B1, B2), eps=EPS)
    for step in range(8):
        step_each(step, (plain, adam0))
    assert not torch.allclose(plain[0], ours[0], atol=1e-4)


def test_second_moment_recursion_by_hand_over_three_steps():
    ps = params()
    opt = GIAdam(ps, lr=LR, betas=(B1, B2), eps=EPS)
    v = None
    for step in range(3):
        opt.zero_grad()
        loss(ps, step).backward()
        g = ps[0].grad.clone()
        v = g * g if v is None else B2 * v + (1 - B2) * g * g
        opt.step()
        assert torch.allclose(opt.state[ps[0]]["exp_avg_sq"], v, rtol=1e-6)


def test_a_parameter_first_seen_later_is_initialized_from_its_own_first_gradient():
    a, b = params()
    opt = GIAdam([a, b], lr=LR, betas=(B1, B2), eps=EPS)
    (a ** 2).sum().backward()  # b has no gradient yet
    opt.step()
    assert len(opt.state[b]) == 0
    opt.zero_grad()
    (b ** 3).sum().backward()
    g = b.grad.clone()
    opt.step()
    assert torch.equal(opt.state[b]["exp_avg_sq"], g * g)


def test_built_through_fairseq_with_adams_option_names():
    ps = params()
    opt = build_optimizer(OmegaConf.create(dict(_name="giadam", lr=[LR], adam_betas="(0.9, 0.98)", adam_eps=EPS,
                                                weight_decay=0.0)), ps)
    assert isinstance(opt.optimizer, GIAdam) and opt.optimizer.defaults["betas"] == (0.9, 0.98)
    with pytest.raises(LnposError, match="--adam-betas must be two numbers"):
        build_optimizer(OmegaConf.create(dict(_name="giadam", lr=[LR], adam_betas="(0.9, 1.5)", adam_eps=EPS,
                                              weight_decay=0.0)), params())
    with pytest.raises(LnposError, match="--adam-eps must be positive"):
        build_optimizer(OmegaConf.create(dict(_name="giadam", lr=[LR], adam_betas="(0.9, 0.98)", adam_eps=0.0,
                                              weight_decay=0.0)), params())


def test_parsed_from_fairseqs_command_line():
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused-data-dir", "--user-dir", USER_DIR, "--arch", "transformer_postln_tiny", "--optimizer", "giadam",
        "--lr", "3e-4", "--adam-betas", "(0.9, 0.95)", "--adam-eps", "1e-6", "--weight-decay", "0.01"])
    c = convert_namespace_to_omegaconf(args)
    opt = build_optimizer(c.optimizer, params())
    assert isinstance(opt.optimizer, GIAdam)
    d = opt.optimizer.defaults
    assert (d["lr"], d["betas"], d["eps"], d["weight_decay"], d["decoupled_weight_decay"]) == (
        3e-4, (0.9, 0.95), 1e-6, 0.01, True)


@pytest.mark.slow
def test_fairseq_train_trains_with_giadam(toy_data, tmp_path):
    result = run(fairseq_cmd(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--task", "translation", "--arch", "transformer_postln_tiny",
        "--encoder-layers", 1, "--decoder-layers", 1, "--optimizer", "giadam", "--adam-betas", "(0.9, 0.98)",
        "--lr", "1e-3", "--max-tokens", 300, "--max-update", 3, "--log-interval", 1, "--log-format", "simple",
        "--cpu", "--save-dir", tmp_path / "ckpt", "--disable-validation", "--num-workers", 0, "--no-save",
    ), env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "'optimizer': {'_name': 'giadam'" in log
    assert "num_updates=3," in log and "num_updates 3 " in log, log[-2000:]
