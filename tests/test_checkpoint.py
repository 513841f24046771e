"""Checkpoint averaging (checkpoint.average_checkpoints) against averages computed by hand."""
import argparse
from collections import OrderedDict

import pytest
import torch

import fairseq_lnpos
from fairseq_lnpos.checkpoint import CheckpointError, average_checkpoints, write_average

fairseq_lnpos.register()  # torch's safe loader reads fairseq's Namespace, as for every checkpoint here


def save(path, embed, fc, half, steps, epoch):
    """A checkpoint shaped like fairseq's: tied embeddings (three keys, one tensor), fp32, fp16 and an
    integer buffer, the training args as an argparse.Namespace, and other entries."""
    embed = torch.tensor(embed, dtype=torch.float32)
    model = OrderedDict([("encoder.embed_tokens.weight", embed), ("decoder.embed_tokens.weight", embed),
                         ("decoder.output_projection.weight", embed),
                         ("encoder.layers.0.fc1.weight", torch.tensor(fc, dtype=torch.float32)),
                         ("decoder.layers.0.fc2.weight", torch.tensor(half, dtype=torch.float16)),
                         ("encoder.admin_profile", torch.tensor(steps, dtype=torch.long))])
    torch.save({"args": argparse.Namespace(arch="transformer_postln_tiny"), "model": model,
                "extra_state": {"epoch": epoch}, "optimizer_history": [{"num_updates": 10 * epoch}]}, path)
    return path


@pytest.fixture
def three(tmp_path):
    return [save(tmp_path / "checkpoint1.pt", [[1.0, 2.0]], [0.5, -1.0, 4.0], [60000.0, 2048.0], [3], 1),
            save(tmp_path / "checkpoint2.pt", [[3.0, 5.0]], [1.5, -2.0, 1.0], [60000.0, 1.0], [4], 2),
            save(tmp_path / "checkpoint3.pt", [[8.0, 2.0]], [1.0, 0.0, 1.0], [60000.0, 1.0], [6], 3)]


def test_average_of_three_checkpoints_by_hand(three):
    avg = average_checkpoints([str(p) for p in three])
    m = avg["model"]
    assert list(m) == list(torch.load(three[0])["model"])
    # every tied key is the mean of its own values: (1+3+8)/3, (2+5+2)/3, not counted twice through the shared tensor
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        assert m[key].dtype == torch.float32 and m[key].tolist() == [[4.0, 3.0]]
    assert m["encoder.layers.0.fc1.weight"].tolist() == pytest.approx([1.0, -1.0, 2.0])
    # fp16: summed wider than fp16 (60000 x 3 overflows fp16, 2048 + 1 + 1 rounds to 2048 in it), kept fp16
    half = m["decoder.layers.0.fc2.weight"]
    assert half.dtype == torch.float16
    assert half.tolist() == torch.tensor([60000.0, 2050.0 / 3], dtype=torch.float16).tolist()
    fp16_sum = torch.tensor([60000.0, 2048.0], dtype=torch.float16)
    fp16_sum += torch.tensor([60000.0, 1.0], dtype=torch.float16)
    fp16_sum += torch.tensor([60000.0, 1.0], dtype=torch.float16)
    assert fp16_sum.tolist() == [float("inf"), 2048.0]  # what adding in fp16 would give
    # integers: floor division, as fairseq's script
    assert m["encoder.admin_profile"].dtype == torch.long and m["encoder.admin_profile"].tolist() == [13 // 3]
    # everything else is the newest checkpoint's (the last path), as fairseq's script keeps its
    # first input, the newest of --num-epoch-checkpoints
    assert avg["extra_state"] == {"epoch": 3} and avg["optimizer_history"] == [{"num_updates": 30}]
    assert avg["args"].arch == "transformer_postln_tiny"
    assert average_checkpoints([three[2], three[0]])["extra_state"] == {"epoch": 1}
    # the inputs are untouched (nothing was added into a loaded tensor)
    assert torch.load(three[0])["model"]["decoder.embed_tokens.weight"].tolist() == [[1.0, 2.0]]


def test_average_of_one_is_the_checkpoint_and_the_written_file_loads_safely(three, tmp_path):
    one = average_checkpoints([three[1]])["model"]
    orig = torch.load(three[1])["model"]
    assert all(torch.equal(one[k], orig[k]) and one[k].dtype == orig[k].dtype for k in orig)
    out = write_average(three, tmp_path / "checkpoint_average.pt")
    state = torch.load(out, map_location="cpu")  # torch's default loader (weights_only on torch >= 2.6)
    assert state["model"]["encoder.layers.0.fc1.weight"].tolist() == pytest.approx([1.0, -1.0, 2.0])
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left


def test_unusable_inputs_are_checkpoint_errors(three, tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"model": {"encoder.layers.0.fc1.weight": torch.zeros(3)}}, other)
    with pytest.raises(CheckpointError, match="other.pt holds other weights than .*checkpoint1.pt"):
        average_checkpoints([three[0], other])
    with pytest.raises(CheckpointError, match="cannot load checkpoint .*missing.pt"):
        average_checkpoints([three[0], tmp_path / "missing.pt"])
    (tmp_path / "cut.pt").write_bytes(three[0].read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cut.pt"):
        average_checkpoints([tmp_path / "cut.pt"])
    with pytest.raises(CheckpointError, match="no checkpoints"):
        average_checkpoints([])
