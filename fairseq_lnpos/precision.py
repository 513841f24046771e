"""Training precision on the CPU: bfloat16 autocast (``--cpu-autocast-bf16`` of ``--task
translation_lnpos``), the check that the CPU has bfloat16 instructions, and the precision a
fairseq-train command line trains in.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` matmuls and linear layers run in bfloat16
while the parameters, their gradients and the optimizer state stay float32: mixed precision as
``--amp`` does it on a GPU. fairseq's own ``--bf16`` is another thing (it casts the whole model and
implies ``--tpu``). Without bfloat16 instructions (AVX-512 BF16 or AMX) the CPU emulates bfloat16
and autocast slows training down, so the option is refused there.

Imports nothing heavy: torch only inside the functions.
"""
import contextlib

from .errors import LnposError

FLAG = "--cpu-autocast-bf16"
# /proc/cpuinfo flags of bfloat16 arithmetic that oneDNN uses for torch's CPU matmuls
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

# what a run trains in (records, benchmark): fairseq-train flag -> precision, first match wins
BF16_AUTOCAST = "bf16-autocast"
PRECISIONS = ((FLAG, BF16_AUTOCAST), ("--amp", "amp"), ("--memory-efficient-fp16", "fp16"), ("--fp16", "fp16"),
              ("--memory-efficient-bf16", "bf16"), ("--bf16", "bf16"))
FLOAT32 = "float32"


def cpu_bf16_instructions():
    """The bfloat16 instruction sets of this CPU that torch can use ("avx512_bf16", "amx_bf16"),
    as torch detects them (``torch.cpu``), else as ``/proc/cpuinfo`` lists them; empty when none."""
    import torch

    probes = {"avx512_bf16": getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              "amx_bf16": getattr(torch.cpu, "_is_amx_tile_supported", None)}
    if all(probes.values()):
        return tuple(name for name, probe in probes.items() if probe())
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return tuple(name for name in BF16_CPU_FLAGS if name in flags)


def check_cpu_autocast(cpu, cuda_available, fp16=False, bf16=False, amp=False):
    """Refuse ``--cpu-autocast-bf16`` where it cannot apply: with fairseq's own half precision
    (``--fp16``, ``--bf16``, ``--amp``), on a GPU, or on a CPU without bfloat16 instructions."""
    other = [flag for flag, on in (("--fp16", fp16), ("--bf16", bf16), ("--amp", amp)) if on]
    if other:
        raise LnposError(f"{FLAG} and {other[0]} are two kinds of mixed precision: give one ({FLAG} on the CPU, "
                         f"{other[0]} on a GPU)")
    if cuda_available and not cpu:
        raise LnposError(f"{FLAG} is CPU mixed precision and this run trains on a GPU: use --amp or --fp16 there, "
                         f"or add --cpu")
    check_bf16_instructions(FLAG)


def check_bf16_instructions(option):
    """Refuse ``option`` (bfloat16 autocast) on a CPU without bfloat16 instructions."""
    if not cpu_bf16_instructions():
        raise LnposError(f"{option}: this CPU has no bfloat16 instructions ({' or '.join(BF16_CPU_FLAGS)}), so "
                         f"bfloat16 would be emulated and slower than float32: drop {option}")


def autocast(enabled=True):
    """``torch.autocast("cpu", dtype=torch.bfloat16)``, or nothing when not ``enabled``."""
    if not enabled:
        return contextlib.nullcontext()
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


class AutocastCriterion:
    """A fairseq criterion whose calls (the model's forward and the loss) run under bfloat16
    autocast; everything else is the criterion's. The backward pass runs outside: fairseq's
    ``train_step`` calls the criterion, then ``optimizer.backward``."""

    def __init__(self, criterion):
        self.criterion = criterion

    def __call__(self, *args, **kwargs):
        with autocast():
            return self.criterion(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.criterion, name)


def precision_of(argv):
    """The precision a fairseq-train command line (its arguments) trains in: "bf16-autocast",
    "amp", "fp16", "bf16" or "float32"."""
    given = {a.split("=", 1)[0] for a in map(str, argv)}
    return next((name for flag, name in PRECISIONS if flag in given), FLOAT32)
