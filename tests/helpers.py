"""What the model tests share: random tokens, a layer's sublayers computed by hand, decoding two
ways, and fairseq-train / fairseq-generate on the toy corpus with the BLEU they print checked."""
import torch

from conftest import USER_DIR, fairseq_cmd, run

# the decoder's self-attention mask for 5 target positions
CAUSAL = torch.triu(torch.full((5, 5), float("-inf")), 1)


def randomize_norms(model, seed=0):
    """Every normalization's weight and bias random, so that a formula using the wrong one fails."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g) if name.endswith("weight")
                        else 0.5 * torch.randn(p.shape, generator=g))


def bare(module, *args, **kwargs):
    """The module's own forward, without the hooks a variant put on it."""
    return type(module).forward(module, *args, **kwargs)


def self_attn(layer, x, **kw):
    return bare(layer.self_attn, query=x, key=x, value=x, need_weights=False, **kw)[0]


def cross_attn(layer, x, enc):
    return bare(layer.encoder_attn, query=x, key=enc, value=enc, static_kv=True, need_weights=False)[0]


def ffn(layer, x, inner=None):
    """The layer's FFN, fc2(activation(fc1(x))), without the hooks a variant put on fc1 or fc2; ``inner``:
    a normalization between the activation and fc2 (NormFormer's, Sub-LN's)."""
    h = layer.activation_fn(bare(layer.fc1, x))
    return bare(layer.fc2, h if inner is None else inner(h))


def tokens(task, bsz, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(task.source_dictionary.nspecial, len(task.source_dictionary), (bsz, length), generator=g)


def decode_both_ways(model, task, src_len=6, tgt_len=5):
    """The decoder's output for a batch, teacher-forced at once and step by step with its incremental state."""
    src, prev = tokens(task, 2, src_len, 11), tokens(task, 2, tgt_len, 12)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((2,), src_len))
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0] for t in range(tgt_len)]
        return model.decoder(prev, encoder_out=enc)[0], torch.cat(steps, 1)


def fairseq_train(data, save_dir, arch, updates=2):
    """fairseq-train to ``updates`` updates (resuming from ``save_dir`` if it holds a checkpoint): its log."""
    train = run(fairseq_cmd(
        "fairseq-train", data, "--user-dir", USER_DIR, "--cpu", "--arch", arch, "--optimizer", "adam",
        "--lr", "5e-4", "--max-tokens", "1000", "--max-update", updates, "--save-dir", save_dir,
        "--no-progress-bar", "--log-interval", "1", "--disable-validation",
    ))
    log = train.stdout + train.stderr
    assert train.returncode == 0, log[-3000:]
    return log


def fairseq_generate(data, save_dir):
    """fairseq-generate with the last checkpoint in ``save_dir``: its output."""
    gen = run(fairseq_cmd("fairseq-generate", data, "--user-dir", USER_DIR, "--cpu", "--path",
                          save_dir / "checkpoint_last.pt", "--beam", "2", "--max-len-a", "1", "--max-len-b", "3",
                          "--batch-size", "64"))
    assert gen.returncode == 0, gen.stderr[-3000:]
    generated_bleu(gen.stdout)
    return gen.stdout + gen.stderr


def generated_bleu(out):
    """fairseq-generate's BLEU as the project's log parser reads it from ``out`` (its stdout), checked
    against the project's scorer (evaluate.tok_bleu) on the hypotheses and references fairseq printed:
    every sentence read has its reference, and the two scores agree to fairseq's two decimals."""
    from fairseq_lnpos.experiments.evaluate import parse_generate, tok_bleu
    from fairseq_lnpos.fairseq_log import bleu4

    bleu = bleu4(out)
    assert bleu is not None and 0 <= bleu <= 100, out[-2000:]
    seen, hyps = parse_generate(out)
    refs = dict(line[2:].split("\t", 1) for line in out.splitlines() if line.startswith("T-"))
    refs = {int(i): ref for i, ref in refs.items()}
    assert seen and set(refs) == seen  # a sentence without a hypothesis scores as an empty output
    ids = sorted(seen)
    assert round(tok_bleu([hyps.get(i, "") for i in ids], [refs[i] for i in ids]), 2) == bleu
    return bleu
