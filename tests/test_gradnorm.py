"""Per-layer gradient norms: grouping, the hook inside fairseq's trainer, and a fairseq-train run."""
import copy
import json
import math
import os

import pytest
import torch

from conftest import USER_DIR, fairseq_cmd, run
from fairseq_lnpos.gradnorm import GradNormPlan, groups_of, parse_name

TINY = ["--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
        "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32,
        "--encoder-attention-heads", 2, "--decoder-attention-heads", 2]
NO_DROPOUT = ["--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0]


def test_groups_of_fairseq_and_unknown_names():
    assert groups_of("encoder.layers.3.fc2.weight") == ("encoder/3/fc2", "encoder/3", "encoder", "total")
    assert groups_of("module.decoder.layers.5.encoder_attn.k_proj.bias")[0] == "decoder/5/encoder_attn"
    assert groups_of("decoder.layers.0.final_layer_norm.weight")[0] == "decoder/0/ffn_ln"
    assert groups_of("encoder.layers.1.self_attn_layer_norm.bias")[0] == "encoder/1/self_attn_ln"
    # a sub-module the table does not know (e.g. Keel's branch LayerNorm) is grouped by layer
    assert groups_of("encoder.layers.2.branch_ln.weight")[:2] == ("encoder/2/branch_ln", "encoder/2")
    assert groups_of("encoder.embed_tokens.weight") == ("encoder/embed", "encoder", "embed", "total")
    assert groups_of("decoder.layer_norm.weight")[0] == "decoder/final_ln"
    assert groups_of("decoder.output_projection.weight") == ("output_projection", "decoder", "total")
    assert parse_name("encoder.layers.12.fc1.weight") == ("encoder", 12, "fc1", "weight")


def test_plan_counts_shared_tensors_once():
    class Stack(torch.nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.embed_tokens = emb
            self.layers = torch.nn.ModuleList([torch.nn.Module()])
            self.layers[0].fc1 = torch.nn.Linear(3, 4)
            self.layers[0].odd_ln = torch.nn.LayerNorm(4)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            emb = torch.nn.Embedding(5, 3)
            self.encoder, self.decoder = Stack(emb), Stack(emb)
            self.decoder.output_projection = torch.nn.Linear(3, 5, bias=False)
            self.decoder.output_projection.weight = emb.weight

    m = Model()
    for i, p in enumerate(m.parameters()):
        p.grad = torch.full_like(p, float(i + 1))
    plan = GradNormPlan(m)
    groups, params = plan.compute(scale=0.5)
    unique = {id(p): p for p in m.parameters()}.values()
    total = math.sqrt(sum(float((0.5 * p.grad).pow(2).sum()) for p in unique))
    assert groups["total"] == pytest.approx(total, rel=1e-6)
    emb = 0.5 * float(m.encoder.embed_tokens.weight.grad.norm())
    assert groups["embed"] == groups["output_projection"] == groups["decoder/embed"] == pytest.approx(emb)
    assert groups["encoder/0/odd_ln"] == pytest.approx(0.5 * math.hypot(
        m.encoder.layers[0].odd_ln.weight.grad.norm(), m.encoder.layers[0].odd_ln.bias.grad.norm()))
    assert len(params) == len(list(unique))


def _trainer(data, save_dir, *extra):
    from fairseq.trainer import Trainer

    from fairseq_lnpos import fairseq_build

    cfg, task, model = fairseq_build.build([
        data, "--user-dir", USER_DIR, "--task", "translation_lnpos", "-s", "de", "-t", "en",
        "--arch", "transformer", *TINY, *NO_DROPOUT, "--cpu", "--optimizer", "adam",
        "--lr", "1e-3", "--max-tokens", "200", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--log-grad-norms", "--grad-norm-interval", "1",
        "--save-dir", save_dir, "--seed", "3", *extra], seed=3)[1:]
    task.load_dataset("train")
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=200, seed=1).next_epoch_itr(shuffle=False)
    return trainer, task, [next(itr) for _ in range(4)]


def _manual_norms(model, samples, criterion):
    """Norms of the gradient of (sum of losses) / (sum of sample sizes): fairseq's mean loss."""
    model = copy.deepcopy(model)
    model.train()
    model.zero_grad()
    losses, sizes = zip(*[criterion(model, s)[:2] for s in samples])
    (sum(losses) / sum(sizes)).backward()
    return {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("update_freq", [1, 2])
def test_hook_equals_norms_of_mean_loss(toy_data, tmp_path, update_freq):
    trainer, task, batches = _trainer(toy_data, tmp_path, "--update-freq", update_freq)
    for step in range(2):  # the second update checks that the logger follows fairseq's counter
        samples = batches[step * update_freq:(step + 1) * update_freq]
        prepared = [trainer._prepare_sample(s)[0] for s in samples]
        expected = _manual_norms(trainer.model, prepared, trainer.criterion)
        assert trainer.train_step(samples) is not None
        groups, params = task.grad_norm_logger.last
        assert set(params) == set(expected)
        tiny = 1e-7 * max(expected.values())  # k_proj.bias: mathematically 0, numerically noise
        for name, value in expected.items():
            assert params[name] == pytest.approx(value, rel=1e-5, abs=tiny), name
        assert groups["encoder/1/fc2"] == pytest.approx(math.hypot(
            expected["encoder.layers.1.fc2.weight"], expected["encoder.layers.1.fc2.bias"]), rel=1e-5)
        assert groups["total"] == pytest.approx(math.sqrt(sum(v * v for v in expected.values())), rel=1e-5)
    records = [json.loads(line) for line in (tmp_path / "grad_norms.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [1, 2]
    assert records[-1]["norms"]["total"] == pytest.approx(groups["total"])


def test_bad_interval_is_one_line_error():
    from fairseq_lnpos.errors import LnposError
    from fairseq_lnpos.tasks.translation_lnpos import GradNormLogger

    with pytest.raises(LnposError, match="--grad-norm-interval must be at least 1"):
        GradNormLogger(-1)


@pytest.mark.slow
def test_fairseq_train_writes_tensorboard_and_jsonl(toy_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save, tb = tmp_path / "ckpt", tmp_path / "tb"
    result = run(fairseq_cmd(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--task", "translation_lnpos", "--log-grad-norms",
        "--arch", "transformer", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 300,
        "--max-update", 4, "--log-interval", 2, "--log-format", "simple", "--cpu", "--no-save",
        "--save-dir", save, "--tensorboard-logdir", tb, "--disable-validation", "--num-workers", 0,
    ), env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    # the log line carries one number, the largest per-layer norm; the groups are in the JSONL only
    lines = [line for line in log.splitlines() if "train_inner" in line]
    assert len(lines) == 2 and all("gnorm/layer_max=" in line for line in lines)
    assert "gnorm/encoder/1/fc2" not in log and "gnorm/decoder/0/encoder_attn" not in log
    records = [json.loads(line) for line in (save / "grad_norms.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [2, 4]  # --grad-norm-interval defaults to --log-interval
    for layer in range(2):
        for sub in ("self_attn", "self_attn_ln", "fc1", "fc2", "ffn_ln"):
            assert records[0]["norms"][f"encoder/{layer}/{sub}"] > 0
        assert records[0]["norms"][f"decoder/{layer}/encoder_attn"] > 0
    for key in ("embed", "output_projection", "total"):
        assert records[0]["norms"][key] > 0
    acc = EventAccumulator(str(tb / "train_inner"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "gnorm/layer_max" in tags and not any(t.startswith("gnorm/encoder") for t in tags)
    events = acc.Scalars("gnorm/layer_max")
    assert [e.step for e in events] == [2, 4]
    layer_max = [max(v for g, v in r["norms"].items() if g.split("/")[-1].isdigit()) for r in records]
    assert [e.value for e in events] == pytest.approx(layer_max, rel=1e-6)


@pytest.mark.parametrize("kind", ["fp16", "amp"])
def test_pending_loss_scale_is_removed(kind):
    """fairseq's fp16 optimizers keep 1/(loss scale * sample size) pending in ``_multiply_factor``;
    --amp unscales inside clip_grad_norm. (Both need CUDA in fairseq, so a stand-in optimizer.)"""
    from fairseq_lnpos.tasks.translation_lnpos import GradNormLogger

    model = torch.nn.Module()
    model.encoder = torch.nn.Module()
    model.encoder.layers = torch.nn.ModuleList([torch.nn.Linear(4, 3)])
    true = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    scale = 1024.0 * 37  # loss scale x sample size

    class Optimizer:
        def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
            return torch.tensor(1.0)

    opt = Optimizer()
    if kind == "fp16":
        opt._multiply_factor = torch.tensor(1.0 / scale)
    else:
        opt._grad_scaler = type("Scaler", (), {"get_scale": lambda self: scale})()
    for n, p in model.named_parameters():
        p.grad = true[n] * scale
    logger = GradNormLogger(interval=5)
    logger.attach(opt, model, update_num=3)  # update 4: not logged
    opt.clip_grad_norm(0.0)
    assert logger.last is None
    logger.attach(opt, model, update_num=4)  # update 5
    opt.clip_grad_norm(0.0)
    groups, params = logger.last
    for n, g in true.items():
        assert params[n] == pytest.approx(float(g.norm()), rel=1e-5)
    assert groups["encoder/0"] == groups["total"] == pytest.approx(
        math.sqrt(sum(float(g.norm()) ** 2 for g in true.values())), rel=1e-5)
