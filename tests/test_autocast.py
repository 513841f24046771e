"""--cpu-autocast-bf16 of --task translation_lnpos: the forward pass and the loss of training and
validation run under bfloat16 autocast, parameters and optimizer state stay float32; refused on a
CPU without bfloat16 instructions, beside fairseq's own half precision, on a GPU; off by default."""
import pytest
import torch

from conftest import USER_DIR
from fairseq_lnpos import precision
from fairseq_lnpos.errors import LnposError

TINY = ["--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
        "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32,
        "--encoder-attention-heads", 2, "--decoder-attention-heads", 2]


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU with AVX-512 BF16, whatever this one has (torch emulates bfloat16 where it lacks it)."""
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ("avx512_bf16",))


def _trainer(data, save_dir, *extra):
    from fairseq.trainer import Trainer

    from fairseq_lnpos import fairseq_build

    cfg, task, model = fairseq_build.build([
        data, "--user-dir", USER_DIR, "--task", "translation_lnpos", "-s", "de", "-t", "en",
        "--arch", "transformer", *TINY, "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "200",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--save-dir", save_dir,
        "--seed", "3", *extra], seed=3)[1:]
    task.load_dataset("train")
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=200, seed=1).next_epoch_itr(shuffle=False)
    return trainer, task, [next(itr) for _ in range(2)]


def _watch(model):
    """What the first FFN layer of the encoder saw in each forward pass: (autocast on, output dtype)."""
    seen = []
    layer = model.encoder.layers[0].fc1
    layer.register_forward_hook(lambda m, args, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype)))
    return seen


def test_training_and_validation_forward_in_bf16_autocast_state_in_float32(toy_data, tmp_path, bf16_cpu):
    trainer, task, batches = _trainer(toy_data, tmp_path, "--cpu-autocast-bf16")
    seen = _watch(trainer.model)
    assert trainer.train_step([batches[0]]) is not None
    assert seen == [(True, torch.bfloat16)]
    assert not torch.is_autocast_enabled("cpu")  # the backward and the optimizer step ran outside
    params = list(trainer.model.parameters())
    assert {p.dtype for p in params} == {torch.float32}
    assert {p.grad.dtype for p in params if p.grad is not None} == {torch.float32}
    state = trainer.optimizer.optimizer.state
    moments = [t for p in params for t in state[p].values() if torch.is_tensor(t) and t.is_floating_point()]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    logging_output = trainer.valid_step(batches[1])
    assert seen[1:] == [(True, torch.bfloat16)]
    assert torch.isfinite(torch.tensor(logging_output["loss"]))


def test_off_by_default(toy_data, tmp_path, bf16_cpu):
    trainer, task, batches = _trainer(toy_data, tmp_path)
    assert task.cfg.cpu_autocast_bf16 is False
    seen = _watch(trainer.model)
    trainer.train_step([batches[0]])
    trainer.valid_step(batches[1])
    assert seen == [(False, torch.float32)] * 2


def test_losses_under_autocast_are_close_to_float32(toy_data, tmp_path, bf16_cpu):
    """Same weights, same batch: the validation loss under autocast is the float32 one up to
    bfloat16's rounding (8 bits of mantissa), not another quantity."""
    trainer, task, batches = _trainer(toy_data, tmp_path / "a", "--cpu-autocast-bf16")
    with_autocast = trainer.valid_step(batches[1])["loss"]
    task.autocast = False
    assert trainer.valid_step(batches[1])["loss"] == pytest.approx(with_autocast, rel=0.02)


def _refusal(data, tmp_path, *extra):
    from fairseq_lnpos import fairseq_build

    with pytest.raises(LnposError) as e:
        fairseq_build.build([data, "--user-dir", USER_DIR, "--task", "translation_lnpos", "-s", "de", "-t", "en",
                             "--arch", "transformer", *TINY, "--save-dir", tmp_path / "new", *extra])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "new").exists()
    return str(e.value)


def test_refused_on_a_cpu_without_bf16_instructions(toy_data, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ())
    message = _refusal(toy_data, tmp_path, "--cpu", "--cpu-autocast-bf16")
    assert message.startswith("--cpu-autocast-bf16: this CPU has no bfloat16 instructions (avx512_bf16 or amx_bf16)")
    assert message.endswith("drop --cpu-autocast-bf16")


@pytest.mark.parametrize("flag", ["--fp16", "--bf16", "--amp"])
def test_refused_beside_fairseqs_half_precision(toy_data, tmp_path, bf16_cpu, flag):
    message = _refusal(toy_data, tmp_path, "--cpu", "--cpu-autocast-bf16", flag)
    assert message.startswith(f"--cpu-autocast-bf16 and {flag} are two kinds of mixed precision: give one")


def test_refused_on_a_gpu(toy_data, tmp_path, bf16_cpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "this run trains on a GPU" in _refusal(toy_data, tmp_path, "--cpu-autocast-bf16")


def test_cpu_instructions_as_torch_or_cpuinfo_report_them(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert precision.cpu_bf16_instructions() == ("amx_bf16",)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    assert precision.cpu_bf16_instructions() == tuple(n for n in precision.BF16_CPU_FLAGS if n in flags)


def test_precision_of_a_command_line():
    assert precision.precision_of(["data", "--arch", "x"]) == "float32"
    assert precision.precision_of(["data", "--task", "translation_lnpos", "--cpu-autocast-bf16"]) == "bf16-autocast"
    assert precision.precision_of(["--fp16"]) == precision.precision_of(["--memory-efficient-fp16"]) == "fp16"
    assert precision.precision_of(["--amp"]) == "amp" and precision.precision_of(["--bf16"]) == "bf16"
