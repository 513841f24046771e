"""The grid on GPUs, with the GPUs mocked on the CPU (``torch.cuda`` patched, ``CUDA_VISIBLE_DEVICES`` set):
which GPU each run's processes get, CPU runs that stay on the CPU, the dry run's placement, the memory
and GPU a run records, the evaluator's cache, and one run on several GPUs."""
import json
import os
import signal
import sys
import types
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest

from fairseq_lnpos import launch, provenance
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import evaluator, options, plan
from fairseq_lnpos.experiments.evaluator import Stopped
from fairseq_lnpos.experiments.records import ScoreRequest, Scores
from fairseq_lnpos.experiments.scheduler import Grid, Progress

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toydata import make_toy_data  # noqa: E402

GOOD = "iwslt-preln-adam-lr5e-4-step8"  # Pre-LN without warm-up: no linear decay to size from the data
H100 = "NVIDIA H100 80GB HBM3"


def opts(**kw):
    return options.RunOptions(**kw)


@pytest.fixture
def gpus(monkeypatch):
    """``torch.cuda`` of a machine whose CUDA shows ``n`` GPUs, with ``CUDA_VISIBLE_DEVICES`` as given
    (None: unset)."""
    import torch

    def set_up(n, visible=None):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return set_up


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_toy_data(tmp_path_factory.mktemp("toy"))


# ---------------------------------------------------------------- which GPUs

def test_gpus_are_positions_in_what_cuda_visible_devices_shows(gpus):
    gpus(2, "4,5")
    assert plan.plan_slots(opts(gpus="0,1"), dry_run=False) == ["4", "5"]
    assert plan.plan_slots(opts(gpus="1"), dry_run=False) == ["5"]
    assert plan.plan_slots(opts(gpus="1,0", gpus_per_run=2), dry_run=False) == ["5,4"]
    assert plan.plan_slots(opts(gpus_per_run=2), dry_run=False) == ["4,5"]  # the first two it sees
    with pytest.raises(LnposError) as e:  # the physical ids are not positions in the user's list
        plan.plan_slots(opts(gpus="4,5"), dry_run=False)
    assert str(e.value) == ("--gpus 4,5: no GPU 4, 5 here (CUDA_VISIBLE_DEVICES=4,5 shows 2: 0..1, and --gpus "
                            "counts in it (0 is GPU 4))")
    with pytest.raises(LnposError, match="no GPU 2 here"):  # the dry run checks the ids too
        plan.plan_slots(opts(gpus="0,2"), dry_run=True)


def test_uuid_and_mig_entries_go_to_the_runs_as_given(gpus):
    mig = "MIG-GPU-8f3c2a10-1111-2222-3333-444455556666/1/0"
    gpus(1, f"GPU-8f3c2a10-1111-2222-3333-444455556666, {mig}")  # CUDA shows one MIG instance per process
    slots = plan.plan_slots(opts(gpus="0,1", runs_per_gpu=2), dry_run=False)
    assert sorted(slots) == sorted(["GPU-8f3c2a10-1111-2222-3333-444455556666", mig] * 2)
    with pytest.raises(LnposError, match="one run cannot train on several: give --gpus-per-run 1"):
        plan.plan_slots(opts(gpus="0,1", gpus_per_run=2), dry_run=False)
    gpus(1, "MIG-a,,MIG-b")  # CUDA reads the list up to its first empty entry
    with pytest.raises(LnposError, match=r"no GPU 1 here \(CUDA_VISIBLE_DEVICES=MIG-a shows 1"):
        plan.plan_slots(opts(gpus="0,1"), dry_run=False)


def test_unset_means_the_physical_ids(gpus):
    gpus(2)
    assert plan.plan_slots(opts(gpus="0,1", runs_per_gpu=2), dry_run=False) == ["0", "1", "0", "1"]
    with pytest.raises(LnposError, match=r"--gpus 2: no GPU 2 here \(this machine has 2: 0..1\)"):
        plan.plan_slots(opts(gpus="2"), dry_run=False)
    gpus(0, "")
    with pytest.raises(LnposError, match="no CUDA GPU is visible here"):
        plan.plan_slots(opts(gpus="0"), dry_run=False)


def test_a_run_and_its_evaluator_get_the_entry_not_the_position(gpus, data, tmp_path, monkeypatch):
    """The process a GPU slot starts sees only its entry and records into the run folder; a CPU slot's
    fairseq-train and fairseq-generate get --cpu."""
    gpus(2, "GPU-aaaa,MIG-bbbb")
    o = opts(only=GOOD, data=[str(data)], out=str(tmp_path / "out"), gpus="1", arch_size="tiny", max_epoch=1)
    slots = plan.plan_slots(o, dry_run=False)
    assert slots == ["MIG-bbbb"]
    started = []

    def start(self, cmd, env, log_path, slot):
        started.append((cmd, env, slot))
        raise Stopped()

    monkeypatch.setattr(Grid, "start", start)
    for slot in ("MIG-bbbb", None):
        jobs, _ = plan.make_jobs(o, plan.select_runs(o), dry_run=False)
        grid = Grid(jobs, o, [slot])
        try:
            with pytest.raises(Stopped):
                grid.execute(grid.progress[0], slot)
        finally:
            for e in grid.evaluators.values():
                e.close()
        p = grid.progress[0]
        if slot:
            assert grid.evaluators[slot].env["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb"
        else:
            assert grid.evaluators[None].env.get("CUDA_VISIBLE_DEVICES") == "GPU-aaaa,MIG-bbbb"  # untouched
            assert p.job.cpu and "--cpu" in p.job.generate_argv(1, {"source_lang": "de", "target_lang": "en",
                                                                      "post_process": "sentencepiece"})
    (gpu_cmd, gpu_env, _), (cpu_cmd, cpu_env, _) = started
    assert gpu_cmd[:3] == [sys.executable, "-m", "fairseq_lnpos.launch"] and "--cpu" not in gpu_cmd
    assert gpu_env["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb"
    assert gpu_env[launch.CUDA_RECORD] == str(tmp_path / "out" / GOOD / "seed1")
    assert Path(cpu_cmd[0]).name == "fairseq-train" and cpu_cmd.count("--cpu") == 1
    assert launch.CUDA_RECORD not in cpu_env


def test_the_first_runs_take_the_slots_in_order(tmp_path, monkeypatch):
    """What the dry run says of the first runs holds: run i starts on slot i."""
    taken = {}
    monkeypatch.setattr(Grid, "execute", lambda self, p, slot: taken.setdefault(p.job.index, slot))
    jobs = [types.SimpleNamespace(index=i, label=f"j{i}") for i in range(1, 6)]
    grid = Grid(jobs, opts(out=str(tmp_path)), ["4", "5", "4", "5"])
    grid.run()
    assert [taken[i] for i in (1, 2, 3, 4)] == ["4", "5", "4", "5"] and taken[5] in ("4", "5")


def test_dry_run_shows_each_runs_device(gpus, capsys, tmp_path):
    gpus(2, "4,5")
    assert G.main(["run", "--dry-run", "--only", GOOD, "--seeds", "1,2,3", "--out", str(tmp_path / "o"),
                   "--gpus", "0,1"]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# [")]
    assert [h.split(" -> ")[0] for h in heads] == [
        f"# [1/3] {GOOD} seed 1 on GPU 4", f"# [2/3] {GOOD} seed 2 on GPU 5",
        f"# [3/3] {GOOD} seed 3 on the first free of GPU 4, GPU 5"]
    assert G.main(["run", "--dry-run", "--only", GOOD, "--seeds", "1,2", "--out", str(tmp_path / "o"),
                   "--gpus", "1", "--runs-per-gpu", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count(" on GPU 5 -> ") == 2 and " --cpu" not in out
    gpus(1, "GPU-aa,MIG-bb")
    assert G.main(["run", "--dry-run", "--only", GOOD, "--seeds", "1,2,3", "--out", str(tmp_path / "o"),
                   "--gpus", "1,0"]) == 0
    heads = [line.split(" -> ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("# [")]
    assert [h.split(" seed ")[1] for h in heads] == ["1 on MIG-bb", "2 on GPU-aa", "3 on the first free of MIG-bb, GPU-aa"]
    # a CPU grid: every fairseq command says --cpu
    assert G.main(["run", "--dry-run", "--only", GOOD, "--out", str(tmp_path / "o"), "--jobs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.endswith(" --cpu") for line in lines if line.startswith("fairseq-train ")] == [True]
    assert [" --cpu " in line for line in lines if line.startswith("# test BLEU")] == [True]


# ---------------------------------------------------------------- CPU runs stay on the CPU

def test_cpu_bf16_trains_on_the_cpu_of_a_gpu_machine(gpus, monkeypatch):
    """fairseq parses the CPU slot's --cpu, so the task's check of --cpu-autocast-bf16 passes on a machine
    whose CUDA is available, where without it it refuses."""
    from fairseq_lnpos import fairseq_build, precision

    gpus(1, "0")
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ("amx_bf16",))
    o = opts(only=GOOD, cpu_bf16=True, arch_size="tiny", out="/nonexistent")
    (job,), _ = plan.make_jobs(o, plan.select_runs(o), dry_run=True)
    assert job.cpu and job.config_hash() == replace(job, cpu=False).config_hash()  # not part of the config
    args = fairseq_build.parse(job.train_cmd(1)[1:])
    assert args.cpu and args.cpu_autocast_bf16
    precision.check_cpu_autocast(args.cpu, True)
    with pytest.raises(LnposError, match="add --cpu"):
        precision.check_cpu_autocast(fairseq_build.parse(replace(job, cpu=False).train_cmd(1)[1:]).cpu, True)


# ---------------------------------------------------------------- one run on several GPUs

def test_a_run_on_several_gpus_uses_fairseqs_own_allreduce(tmp_path):
    """--gpus-per-run K > 1: fairseq's legacy_ddp, which gives a parameter that got no gradient a zero one
    (PyTorch's DDP stops at the next update instead); checked with a one-process gloo group."""
    import torch
    import torch.distributed as dist
    from fairseq.distributed import LegacyDistributedDataParallel

    from fairseq_lnpos import fairseq_build as fb

    o = opts(only=GOOD, gpus="0,1", gpus_per_run=2, out="/nonexistent")
    (job,), _ = plan.make_jobs(o, plan.select_runs(o), dry_run=True)
    argv = job.train_cmd(1)[1:]
    args = fb.parse(argv)
    assert args.distributed_world_size == 2 and args.ddp_backend == "legacy_ddp" and not args.cpu
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 2), "unused": torch.nn.Linear(2, 2)})
        ddp = LegacyDistributedDataParallel(model, dist.group.WORLD)
        model["used"](torch.ones(1, 2)).sum().backward()
        ddp.all_reduce_grads()
        assert torch.equal(model["unused"].weight.grad, torch.zeros(2, 2))
        assert model["used"].weight.grad.abs().sum() > 0
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- what a GPU run records

@pytest.fixture
def cuda(monkeypatch):
    """``torch.cuda`` of one H100 on which the process reserved 3 GiB (2 GiB allocated)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: H100)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 3 * 2 ** 30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 2 * 2 ** 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(uuid="8f3c2a10-1111-2222-3333-444455556666"))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: the context is the stated estimate
    return torch.cuda


def cfg(rank=0, cpu=False):
    return types.SimpleNamespace(common=types.SimpleNamespace(cpu=cpu),
                                 distributed_training=types.SimpleNamespace(distributed_rank=rank))


def test_each_process_records_its_gpu_and_what_it_reserved(cuda, tmp_path, monkeypatch):
    monkeypatch.setenv(launch.CUDA_RECORD, str(tmp_path))
    seen = []

    def train(cfg):  # while it trains, the record names the GPU (a run killed outright keeps that)
        seen.append(launch.read_cuda_records(tmp_path))
        return "trained"

    monkeypatch.setattr(launch, "_fairseq_main", train)
    before = signal.getsignal(signal.SIGTERM)
    assert launch.recorded_main(cfg(rank=1)) == "trained"
    assert seen == [[{"rank": 1, "gpu": H100, "cuda_mb": None}]]
    assert signal.getsignal(signal.SIGTERM) is before
    (rec,) = launch.read_cuda_records(tmp_path)
    assert rec == {"rank": 1, "gpu": H100, "reserved_mb": 3072.0, "allocated_mb": 2048.0, "driver_mb": None,
                   "cuda_mb": 3072.0 + launch.CONTEXT_ESTIMATE_MB, "context": "estimate 500 MB"}
    # a failed training records too, and still fails; a resumed launch that reserved less keeps the peak
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda d=None: 2 ** 30)

    def fails(cfg):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(launch, "_fairseq_main", fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        launch.recorded_main(cfg(rank=1))
    assert launch.read_cuda_records(tmp_path)[0]["reserved_mb"] == 3072.0
    # the CPU, or no record folder: nothing written
    monkeypatch.setattr(launch, "_fairseq_main", lambda cfg: "trained")
    assert launch.recorded_main(cfg(rank=0, cpu=True)) == "trained"
    monkeypatch.delenv(launch.CUDA_RECORD)
    assert launch.recorded_main(cfg(rank=0)) == "trained"
    assert [r["rank"] for r in launch.read_cuda_records(tmp_path)] == [1]


@pytest.mark.slow
def test_the_recording_launcher_runs_fairseq_train(toy_data, tmp_path, monkeypatch):
    """``python -m fairseq_lnpos.launch ARGS`` is fairseq-train's own cli_main with recorded_main, found by
    its module's name (as fairseq's processes per GPU unpickle it), in place of its main; on the CPU it
    trains as fairseq-train does and records nothing."""
    import pickle

    from fairseq_cli import train

    from conftest import train_argv, two_layers
    from fairseq_lnpos import register

    register()  # what fairseq's --user-dir import does in a process of its own (this one imported the package)
    monkeypatch.setattr(train, "main", train.main)
    monkeypatch.setattr(launch, "_fairseq_main", None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv(launch.CUDA_RECORD, str(tmp_path))
    argv = train_argv(toy_data, "transformer_preln_tiny", *two_layers("transformer_preln_tiny"), "--cpu",
                      "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--max-update", "2",
                      "--save-dir", tmp_path / "ck", "--no-epoch-checkpoints", "--num-workers", "0")
    assert launch.main([str(a) for a in argv]) == 0
    assert (tmp_path / "ck" / "checkpoint_last.pt").exists()
    assert train.main is launch.recorded_main and pickle.loads(pickle.dumps(train.main)) is launch.recorded_main
    assert launch._fairseq_main is not launch.recorded_main and launch.read_cuda_records(tmp_path) == []


def test_the_drivers_figure_where_nvml_reads_it(cuda, monkeypatch):
    procs = [types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=9 * 2 ** 30),
             types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3.5 * 2 ** 30)]
    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
                                 nvmlDeviceGetComputeRunningProcesses=lambda h: procs if h.startswith("GPU-") else [])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    rec = launch.cuda_record(0)
    assert (rec["driver_mb"], rec["cuda_mb"], rec["context"]) == (3584.0, 3584.0, "driver")


def test_done_records_the_runs_own_gpus_and_memory(tmp_path, monkeypatch, request):
    """DONE.json's provenance names the GPUs the run's processes recorded (not every GPU the driver lists),
    and cuda_peak_mb is the largest of them; a CPU run names none."""
    monkeypatch.setattr(provenance, "_gpus", lambda: ["NVIDIA A100", "NVIDIA A100", H100, H100])
    provenance.machine.cache_clear()  # read once per process: now, with the driver's list above
    request.addfinalizer(provenance.machine.cache_clear)
    for rank, mb in ((0, 5000.0), (1, 5300.5)):
        (tmp_path / f"cuda-rank{rank}.json").write_text(json.dumps({"rank": rank, "gpu": H100, "cuda_mb": mb}))
    job = types.SimpleNamespace(dir=types.SimpleNamespace(path=tmp_path))
    p = Progress(job, slot="GPU-aaaa,GPU-bbbb", log_state=types.SimpleNamespace(cuda_peak_mb=1234.0))
    assert Grid.cuda_peak_mb(p) == 5300.5
    prov = Grid.provenance(p)
    assert prov["gpu"] == [H100, H100] and prov["cuda_visible_devices"] == "GPU-aaaa,GPU-bbbb"
    cpu = Progress(job, slot=None, log_state=types.SimpleNamespace(cuda_peak_mb=None))
    assert Grid.provenance(cpu)["gpu"] == [] and "cuda_visible_devices" not in Grid.provenance(cpu)
    assert Grid.cuda_peak_mb(cpu) is None
    for f in tmp_path.glob("cuda-rank*.json"):  # no record (the run was killed): fairseq's logged peak
        f.unlink()
    assert Grid.cuda_peak_mb(p) == 1234.0
    assert provenance.provenance()["gpu"] == ["NVIDIA A100", "NVIDIA A100", H100, H100]  # a page's machine


# ---------------------------------------------------------------- the evaluator on a GPU

def test_the_evaluator_releases_its_cache_after_each_checkpoint(monkeypatch, tmp_path):
    import io

    import torch

    from fairseq_lnpos.data import manifest

    empty = mock.Mock()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty)
    monkeypatch.setattr(manifest, "read_manifest", lambda d: {})
    scored = []

    def generate_and_score(argv, m, hyp_out, compound_split, phases):
        scored.append(empty.call_count)  # the cache is released between checkpoints, not while scoring
        if "bad" in hyp_out:
            raise RuntimeError("CUDA error")
        return Scores(bleu_tok=1.0)

    monkeypatch.setattr(evaluator, "generate_and_score", generate_and_score)
    reqs = "".join(json.dumps(ScoreRequest(argv=("x",), data="d", hyp_out=h, checkpoint=h).to_json()) + "\n"
                   for h in ("a", "bad", "c"))
    answers = io.StringIO()
    evaluator.serve(io.StringIO(reqs), answers)
    assert scored == [0, 1, 2] and empty.call_count == 3
    assert [("error" in json.loads(line)) for line in answers.getvalue().splitlines()] == [False, True, False]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a CPU evaluator: nothing to release
    evaluator.serve(io.StringIO(reqs), io.StringIO())
    assert empty.call_count == 3
