"""RAdam through fairseq's optimizer wrapper, and the warm-up / step schedules."""
import math

import pytest
import torch
from fairseq.optim import build_optimizer
from fairseq.optim.lr_scheduler import build_lr_scheduler
from omegaconf import OmegaConf

import fairseq_lnpos
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.optim.radam import supports_decoupled_weight_decay


fairseq_lnpos.register()  # radam and the schedulers


def cfg(**kw):
    return OmegaConf.create(kw)


def quadratic_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def loss(params, step):
    return sum(((p - step * 0.1) ** 2).sum() + p.pow(4).sum() * 0.01 for p in params)


@pytest.mark.parametrize("weight_decay,decoupled", [(0.0, False), (0.01, False), (0.01, True)])
def test_radam_matches_torch_radam_step_for_step(weight_decay, decoupled):
    if decoupled and not supports_decoupled_weight_decay():
        pytest.skip(f"torch {torch.__version__}'s RAdam has no decoupled_weight_decay")
    ours, ref = quadratic_params(), quadratic_params()
    opt = build_optimizer(cfg(_name="radam", lr=[3e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-8,
                              weight_decay=weight_decay, decoupled_weight_decay=decoupled), ours)
    torch_opt = torch.optim.RAdam(ref, lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay,
                                  **({"decoupled_weight_decay": True} if decoupled else {}))
    for step in range(12):
        for params, o in ((ours, opt), (ref, torch_opt)):
            o.zero_grad()
            loss(params, step).backward()
            o.step()
        for a, b in zip(ours, ref):
            assert torch.equal(a, b), step
    assert not torch.equal(ours[0], quadratic_params()[0])


def test_radam_under_fairseq_fp16_wrapper_follows_fp32_radam():
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    base = quadratic_params()
    half = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in base]
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused-data-dir", "--user-dir", str(fairseq_lnpos.USER_DIR), "--arch", "transformer_preln_tiny", "--bf16",
        "--optimizer", "radam", "--lr", "1e-2", "--adam-betas", "(0.9, 0.98)", "--fp16-init-scale", "1",
    ])
    c = convert_namespace_to_omegaconf(args)
    opt = FP16Optimizer.build_optimizer(c, half)
    ref = torch.optim.RAdam(base, lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
    for step in range(5):
        opt.zero_grad(); ref.zero_grad()
        opt.backward(loss(half, step)); loss(base, step).backward()
        opt.step(); ref.step()
    for h, b in zip(half, base):
        assert torch.allclose(h.float(), b, atol=2e-2)
    assert not torch.allclose(half[0].float(), quadratic_params()[0].to(torch.bfloat16).float(), atol=1e-3)


def test_decoupled_weight_decay_on_a_torch_without_it_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr("fairseq_lnpos.optim.radam.supports_decoupled_weight_decay", lambda: False)
    with pytest.raises(LnposError, match="--decoupled-weight-decay: the RAdam of torch .* upgrade torch or drop the flag"):
        build_optimizer(cfg(_name="radam", lr=[1e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-8,
                            weight_decay=0.01, decoupled_weight_decay=True), quadratic_params())


@pytest.mark.parametrize("values, message", [
    (dict(adam_eps=float("inf")), r"^--adam-eps must be positive, got inf$"),
    (dict(adam_eps=float("nan")), r"^--adam-eps must be positive, got nan$"),
    (dict(adam_eps=0.0), r"^--adam-eps must be positive, got 0\.0$"),
    (dict(weight_decay=float("inf")), r"^--weight-decay must be at least 0, got inf$"),
    (dict(weight_decay=float("nan")), r"^--weight-decay must be at least 0, got nan$"),
    (dict(weight_decay=-0.1), r"^--weight-decay must be at least 0, got -0\.1$"),
    (dict(lr=[float("inf")]), r"^--lr must be positive, got inf$"),
])
def test_radam_refuses_a_non_finite_or_negative_number(values, message):
    config = dict(_name="radam", lr=[1e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.0,
                  decoupled_weight_decay=False)
    with pytest.raises(LnposError, match=message):
        build_optimizer(cfg(**{**config, **values}), quadratic_params())


@pytest.mark.parametrize("betas", ["(0.9,)", "(1.5, 0.9)", "nonsense"])
def test_radam_rejects_bad_betas(betas):
    with pytest.raises(LnposError, match="--adam-betas"):
        build_optimizer(cfg(_name="radam", lr=[1e-3], adam_betas=betas, adam_eps=1e-8,
                            weight_decay=0.0, decoupled_weight_decay=False), quadratic_params())


def schedule(name, lr=1e-3, **kw):
    opt = build_optimizer(cfg(_name="radam", lr=[lr], adam_betas="(0.9, 0.98)", adam_eps=1e-8,
                              weight_decay=0.0, decoupled_weight_decay=False), quadratic_params())
    sched = build_lr_scheduler(cfg(_name=name, lr=[lr], **kw), opt)
    return opt, sched


def rates(opt, sched, updates, epoch_of=lambda u: 1):
    """The rate each update runs at, calling the scheduler as fairseq's trainer does."""
    sched.step_update(0)  # Trainer builds the scheduler, then step_update(0)
    out, epoch = [], 0
    for u in range(1, updates + 1):
        if epoch_of(u) != epoch:
            epoch = epoch_of(u)
            sched.step_begin_epoch(epoch)
            sched.step_update(u - 1)  # Trainer.lr_step_begin_epoch
        out.append(opt.get_lr())
        sched.step_update(u)
    return out


@pytest.mark.parametrize("warmup", [4000, 500, 10])
def test_warmup_first_update_at_lr_over_t_and_lr_max_at_t(warmup):
    opt, sched = schedule("warmup_inverse_sqrt", lr=5e-4, warmup_updates=warmup, decay_anchor=None)
    r = rates(opt, sched, warmup + 100)
    assert r[0] == pytest.approx(5e-4 / warmup)
    assert r[warmup - 1] == pytest.approx(5e-4)
    assert max(r) == pytest.approx(5e-4)
    assert r[warmup + 99] == pytest.approx(5e-4 * math.sqrt(warmup / (warmup + 100)))


@pytest.mark.parametrize("warmup", [0, 1])
def test_no_warmup_starts_at_lr_max(warmup):
    opt, sched = schedule("warmup_inverse_sqrt", lr=1e-3, warmup_updates=warmup, decay_anchor=None)
    r = rates(opt, sched, 4)
    assert r == pytest.approx([1e-3, 1e-3 / math.sqrt(2), 1e-3 / math.sqrt(3), 1e-3 / 2])


@pytest.mark.parametrize("warmup", [1, 50])
def test_decay_anchor_holds_lr_max_then_gives_every_warmup_the_same_decay(warmup):
    opt, sched = schedule("warmup_inverse_sqrt", lr=1e-3, warmup_updates=warmup, decay_anchor=100)
    r = rates(opt, sched, 400)
    assert r[0] == pytest.approx(1e-3 / warmup)
    assert r[warmup - 1:100] == pytest.approx([1e-3] * (101 - warmup))  # lr_max from T to A
    assert r[399] == pytest.approx(1e-3 * math.sqrt(100 / 400))


def test_negative_warmup_is_an_error():
    with pytest.raises(LnposError, match="--warmup-updates must be >= 0"):
        schedule("warmup_inverse_sqrt", warmup_updates=-5, decay_anchor=None)


def test_step_decay_multiplies_by_factor_from_epoch_k():
    opt, sched = schedule("step_decay", lr=5e-4, decay_epoch=8, decay_factor=0.1, inverse_sqrt_after_decay=False)
    r = rates(opt, sched, 100, epoch_of=lambda u: (u - 1) // 10 + 1)
    assert r[:70] == pytest.approx([5e-4] * 70)  # epochs 1-7
    assert r[70:] == pytest.approx([5e-5] * 30)  # epochs 8-10


def test_step_decay_then_inverse_sqrt_and_resume():
    opt, sched = schedule("step_decay", lr=1e-3, decay_epoch=6, decay_factor=0.1, inverse_sqrt_after_decay=True)
    r = rates(opt, sched, 100, epoch_of=lambda u: (u - 1) // 10 + 1)
    assert r[49] == pytest.approx(1e-3)
    assert r[50] == pytest.approx(1e-4 * math.sqrt(50 / 51))
    assert r[99] == pytest.approx(1e-4 * math.sqrt(50 / 100))
    # a run resumed from a checkpoint continues the same curve
    opt2, sched2 = schedule("step_decay", lr=1e-3, decay_epoch=6, decay_factor=0.1, inverse_sqrt_after_decay=True)
    sched2.load_state_dict(sched.state_dict())
    sched2.step_update(99)
    assert opt2.get_lr() == pytest.approx(r[99])


def test_the_grids_radam_rows_decay_linearly_to_zero():
    """The flags the grid gives the paper's RAdam rows ("linear decay", no warm-up), through
    fairseq's scheduler: lr_max at the first update, falling linearly to 0 at the last."""
    from fairseq_lnpos.experiments import commands, runs

    row = next(r for r in runs.RUNS if r.optimizer == "radam").with_defaults()
    row = runs.coerce(row, "lr", "1e-3")
    flags = commands.schedule_args(row, total_updates=100)
    value = dict(zip(flags[::2], flags[1::2]))
    assert value["--lr-scheduler"] == "polynomial_decay"
    opt, sched = schedule("polynomial_decay", lr=float(value["--lr"]), warmup_updates=int(value["--warmup-updates"]),
                          force_anneal=None, end_learning_rate=float(value["--end-learning-rate"]),
                          power=float(value["--power"]), total_num_update=int(value["--total-num-update"]))
    r = rates(opt, sched, 100)
    assert r[0] == pytest.approx(1e-3)
    assert r[50] == pytest.approx(1e-3 * (1 - 50 / 100))
    assert r[99] == pytest.approx(1e-5)


def test_tfixup_schedule_is_lr_times_sqrt_a_over_a_plus_t():
    """T-Fixup's inverse_sqrt_nowarmup: lr_max at the first update, then lr * sqrt(A / (A + n)) after n
    updates, as its official code sets it in step_update(n); resumed, the same curve."""
    opt, sched = schedule("inverse_sqrt_nowarmup", lr=5e-4, decay_period=4000)
    r = rates(opt, sched, 12001)
    assert r[0] == 5e-4
    assert r[4000] == pytest.approx(5e-4 * math.sqrt(0.5))  # update 4001 follows 4000 updates
    assert r[12000] == pytest.approx(5e-4 / 2)
    assert all(a > b for a, b in zip(r, r[1:]))
    opt2, sched2 = schedule("inverse_sqrt_nowarmup", lr=5e-4, decay_period=4000)
    sched2.load_state_dict(sched.state_dict())
    sched2.step_update(12000)
    assert opt2.get_lr() == pytest.approx(r[12000])
    with pytest.raises(LnposError, match="--decay-period must be >= 1"):
        schedule("inverse_sqrt_nowarmup", decay_period=0)


def test_the_transformer_clinic_rows_warm_up_from_1e_7():
    """fairseq's own inverse_sqrt with the flags of the Transformer-Clinic rows: 1e-7 at the first
    update, lr_max after 6000, then lr_max * sqrt(6000 / n)."""
    from fairseq_lnpos.experiments import commands, runs

    flags = commands.schedule_args(runs.BY_NAME["ref-iwslt-clinic-admin"], total_updates=None)
    value = dict(zip(flags[::2], flags[1::2]))
    assert value["--lr-scheduler"] == "inverse_sqrt"
    opt, sched = schedule("inverse_sqrt", lr=float(value["--lr"]), warmup_updates=int(value["--warmup-updates"]),
                          warmup_init_lr=float(value["--warmup-init-lr"]))
    r = rates(opt, sched, 24001)
    assert r[0] == pytest.approx(1e-7)
    assert r[3000] == pytest.approx(1e-7 + 3000 * (7e-4 - 1e-7) / 6000)
    assert r[6000] == pytest.approx(7e-4)
    assert r[24000] == pytest.approx(7e-4 / 2)


def test_the_radam_repository_rows_warm_up_then_decay_linearly_to_1e_9():
    from fairseq_lnpos.experiments import commands, runs

    for name, warmup in (("ref-iwslt-radamrepo-adam-wu4000", 4000), ("ref-iwslt-radamrepo-radam-nowu", 0)):
        flags = commands.schedule_args(runs.BY_NAME[name], total_updates=70000)
        value = dict(zip(flags[::2], flags[1::2]))
        opt, sched = schedule("polynomial_decay", lr=float(value["--lr"]), warmup_updates=int(value["--warmup-updates"]),
                              force_anneal=None, end_learning_rate=float(value["--end-learning-rate"]),
                              power=float(value["--power"]), total_num_update=int(value["--total-num-update"]))
        r = rates(opt, sched, 70000)
        # the RAdam repository's nmt/my_module/linear_schedule.py after n updates, past the warm-up
        liu = lambda n: (3e-4 - 1e-9) * (1 - (n - max(warmup, 1)) / (70000 - max(warmup, 1))) + 1e-9  # noqa: E731
        assert r[40000] == pytest.approx(liu(40000), rel=1e-3) and r[69999] == pytest.approx(liu(69999), rel=1e-3)
        assert max(r) == pytest.approx(3e-4)
        assert r[0] == (3e-4 if not warmup else 0.0)  # fairseq warms up from 0; the repository from 1e-8
        if warmup:
            assert r[2000] == pytest.approx(3e-4 / 2)


def tfixup_fork_step(params, state, lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4):
    """Reference oracle: the update of layer6ai-labs/T-Fixup's ``fairseq/optim/adam.py`` (lines
    204-253, the class that `--optimizer adam` builds without apex), written here from its formulas:
    decoupled decay p <- p (1 - lr wd) at every step, then while rho_t < 5 an SGD-with-momentum step
    lr m_t / (1 - b1^t), after that lr sqrt((1 - b2^t) r_t) / (1 - b1^t) m_t / (sqrt(v_t) + eps)."""
    b1, b2 = betas
    state["t"] = t = state.get("t", 0) + 1
    rho_inf = 2 / (1 - b2) - 1
    rho = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
    with torch.no_grad():
        for i, p in enumerate(params):
            m, v = state.setdefault(i, (torch.zeros_like(p), torch.zeros_like(p)))
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            p.mul_(1 - weight_decay * lr)
            if rho >= 5:
                r = (rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)
                p.addcdiv_(m, v.sqrt() + eps, value=-lr * math.sqrt((1 - b2 ** t) * r) / (1 - b1 ** t))
            else:
                p.add_(m, alpha=-lr / (1 - b1 ** t))


def test_tfixup_forks_adam_is_radam_with_decoupled_weight_decay_not_fairseqs_adam():
    """The T-Fixup row's optimizer: the fork's update equals the plugin's radam with
    --decoupled-weight-decay (the row's flags) step for step, including the first 5 SGD-like steps
    (rho_t < 5 at beta2 0.98), and is neither fairseq's Adam (the twin row) nor torch's coupled decay."""
    from fairseq_lnpos.experiments import commands, runs

    row = runs.BY_NAME["ref-iwslt-tfixup"]
    flags = commands.optimizer_args(row)
    assert flags[:2] == ["--optimizer", "radam"] and "--decoupled-weight-decay" in flags
    lr, kw = row.lr, dict(adam_betas=row.adam_betas, adam_eps=row.adam_eps, weight_decay=row.weight_decay)
    f64 = lambda: [torch.nn.Parameter(p.detach().double()) for p in quadratic_params()]  # noqa: E731
    fork, ours, adam, coupled = f64(), f64(), f64(), f64()
    opts = {"ours": (ours, build_optimizer(cfg(_name="radam", lr=[lr], decoupled_weight_decay=True, **kw), ours)),
            "adam": (adam, build_optimizer(cfg(_name="adam", lr=[lr], tpu=False, use_old_adam=False,
                                               fp16_adam_stats=False, **kw), adam)),
            "coupled": (coupled, build_optimizer(cfg(_name="radam", lr=[lr], decoupled_weight_decay=False, **kw),
                                                 coupled))}
    state, gap = {}, {}
    for step in range(300):
        for params, o in [(fork, None), *opts.values()]:
            for p in params:
                p.grad = None
            loss(params, step).backward()
            if o is None:
                tfixup_fork_step(fork, state, lr)
            else:
                o.step()
        gap = {k: max((a - b).abs().max().item() for a, b in zip(fork, ps)) for k, (ps, _) in opts.items()}
        assert gap["ours"] < 1e-12, step
        if step == 4:  # the SGD-like steps: a different update from Adam's already
            assert gap["adam"] > 1e-3
    assert gap["adam"] > 1e-2 and gap["coupled"] > 1e-6


def test_every_schedule_of_the_run_table_has_its_flags_in_one_place():
    """--set schedule=NAME takes the names of runs.SCHEDULES; commands.SCHEDULE_FLAGS gives each its
    fairseq flags, and no other schedule."""
    from dataclasses import replace

    from fairseq_lnpos.experiments import commands, runs

    assert list(commands.SCHEDULE_FLAGS) == list(runs.SCHEDULES)
    row = runs.BY_NAME["demo-postln-nowu"].with_defaults()
    for name, (scheduler, _) in commands.SCHEDULE_FLAGS.items():
        flags = commands.schedule_args(replace(row, schedule=name), total_updates=10)
        assert flags[:4] == ["--lr-scheduler", scheduler, "--lr", str(row.lr)], name
    with pytest.raises(LnposError, match="unknown schedule 'cosine'"):
        commands.schedule_args(replace(row, schedule="cosine"), total_updates=10)
