"""Admin (Liu et al., EMNLP 2020, "Understanding the Difficulty of Training Transformers",
arXiv 2004.08249), as in its official code (LiyuanLucasLiu/Transformer-Clinic,
``fairseq/fairseq/modules/transformer_layer.py``, ``--init-type adaptive-profiling`` / ``adaptive``).

Each sublayer computes ``x_i = LN(w_i * x_{i-1} + F_i(x_{i-1}))``: fairseq's Post-LN layer with the
skip scaled element-wise by ``w_i``, a trainable vector of ``embed_dim`` entries, as in the official
code (an ``nn.Parameter`` there). All other weights keep fairseq's initialisation, as for Post-LN.

``w`` is set at initialisation by a profiling forward pass on a training batch (training mode, so
with dropout, and without gradients), per stack, sublayer by sublayer in forward order::

    r_1 = 1,   w_i = r_i,   r_{i+1} = sqrt(Var[w_i * x_{i-1}] + Var[F_i(x_{i-1})])

with ``Var`` the population variance over every element of the (time x batch x dim) tensor,
padding positions included, and ``F_i`` the sublayer's output after dropout; the encoder and the
decoder each start at ``r_1 = 1``. Since ``x_{i-1}`` is a LayerNorm output for i > 1 (variance 1 at
initialisation), this is the paper's ``w_i^2 = sum_{j<i} Var[F_j]`` plus the embedding's variance.

Where this differs from the official code, or the code is silent:

* ``w = w_init + w_delta``: the profiled value is a buffer (``<sublayer>_skip_init``), what training
  learns a parameter initialised to 0 (``<sublayer>_skip_delta``). Adam's updates of ``w`` are the
  same either way (the gradient of ``w_delta`` is that of ``w``); weight decay pulls ``w`` towards
  ``w_init`` instead of 0. Why: fairseq's ``--fp16`` optimizer keeps fp32 copies of the parameters,
  taken when it is built, before the first forward, and writes them back after every update: a
  profiled parameter would be reset to 1.
* The official code profiles in a separate run (one batch, then exit) that writes a file the
  training run reads. Here the model profiles itself lazily: the first training-mode forward of a
  model built from scratch first runs the profiling pass on its own batch, then the real forward
  with the profiled ``w``. Why lazily: fairseq builds the model before it loads a checkpoint and
  before it loads the training data (fairseq-train, fairseq-generate, the Fig. 3 analysis), so only
  the first training-mode forward knows both that the model is trained and what a training batch is.
* ``--admin-profile-batches K`` (default 1, as the official code) profiles the first K
  training-mode forwards: each sets ``w_init^2`` to the mean of the ``r^2`` measured so far, so
  batches 2..K are measured after the updates in between; 0 keeps ``w_init = 1``.
* The buffer ``admin_profile = [batches profiled, K]`` is in the state dict: a checkpoint
  (fairseq-generate, ``--restore-file``, resuming) never profiles again.
* With several workers the ``r^2`` are averaged over all of them, so every replica starts from the
  same ``w``; LayerDrop is off during the profiling pass.
* Each profiled batch is logged: ``Admin: w profiled on batch 1/1 (B sentences): encoder ...; decoder ...``.

The skip costs one ``torch.addcmul`` per sublayer (fairseq's ``residual + x`` is one ``add``) and the
``embed_dim``-sized sum ``w_init + w_delta``; no matmul.
"""
import logging
import math

from fairseq.models import register_model
from fairseq.modules import LayerDropModuleList
import torch
from torch import nn

from ..errors import check
from .sublayers import SublayerResiduals, sublayer_names
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel

logger = logging.getLogger(__name__)


class SkipProfile:
    """One stack's profiling recursion: ``w_i = r_i``, ``r_{i+1} = sqrt(Var[w_i x] + Var[F_i])``."""

    def __init__(self):
        self.ratio = 1.0
        self.measured = []  # (w_init buffer, r_i), in forward order

    def step(self, w_init, branch, residual):
        w = self.ratio
        self.measured.append((w_init, w))
        var = (residual.float() * w).var(unbiased=False) + branch.float().var(unbiased=False)
        self.ratio = math.sqrt(float(var))
        return w


class AdminLayer(SublayerResiduals):
    """fairseq's Post-LN layer with the skip of each sublayer scaled by its ``w``."""

    profile = None  # a SkipProfile while the model profiles

    def admin_init(self):
        self.skip_names = [f"{name}_skip" for name in sublayer_names(self)]
        for name in self.skip_names:
            self.register_buffer(f"{name}_init", torch.ones(self.embed_dim))  # w at initialisation (profiled)
            setattr(self, f"{name}_delta", nn.Parameter(torch.zeros(self.embed_dim)))  # what training adds

    def skip_weight(self, name):
        """``w = w_init + w_delta`` of the sublayer ``name`` (one of ``skip_names``)."""
        return getattr(self, f"{name}_init") + getattr(self, f"{name}_delta")

    def sublayer_residual(self, name, x, residual):
        name = f"{name}_skip"
        if self.profile is not None:
            return x + self.profile.step(getattr(self, f"{name}_init"), x, residual) * residual
        return torch.addcmul(x, residual, self.skip_weight(name))


class AdminEncoderLayer(AdminLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.admin_init()


class AdminDecoderLayer(AdminLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.admin_init()


def mean_over_workers(t):
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
        t /= torch.distributed.get_world_size()
    return t


@register_model("transformer_admin")
class AdminTransformerModel(VariantTransformerModel):
    """Profiles ``w`` on its first training-mode forward(s) unless ``admin_profile`` says it is done."""

    encoder_layer_cls = AdminEncoderLayer
    decoder_layer_cls = AdminDecoderLayer

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        k = getattr(args, "admin_profile_batches", 1)
        check(k >= 0, f"--admin-profile-batches must be 0 or more, got {k}")
        self.register_buffer("admin_profile", torch.tensor([0, k]))  # [batches profiled, batches to profile]
        self._admin_done = k == 0

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--admin-profile-batches", type=int, default=1, metavar="K",
                            help="training batches whose forward pass sets Admin's skip weights w "
                                 "(the first K training-mode forwards of a model built from scratch; "
                                 "0: w = 1)")

    def load_state_dict(self, *args, **kwargs):
        self._admin_done = False  # read admin_profile again at the next training-mode forward
        return super().load_state_dict(*args, **kwargs)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        if self.training and not self._admin_done:
            self.profile_if_due(src_tokens, src_lengths, prev_output_tokens)
        return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)

    def profile_if_due(self, src_tokens, src_lengths, prev_output_tokens):
        """Profile this batch, in training mode, if fewer than K batches are profiled: what the first
        training-mode forwards do; code that measures an Admin model at initialisation in eval mode
        calls it first with a training batch."""
        done, total = self.admin_profile.tolist()
        self._admin_done = done >= total
        if self._admin_done:
            return
        was_training = self.training
        self.train()
        try:
            self.profile_skips(src_tokens, src_lengths, prev_output_tokens)
        finally:
            self.train(was_training)

    def skip_layers(self):
        return {"encoder": list(self.encoder.layers), "decoder": list(self.decoder.layers)}

    @torch.no_grad()
    def profile_skips(self, src_tokens, src_lengths, prev_output_tokens):
        """Profile one batch and set every ``w`` (see the module docstring)."""
        profiles = {stack: SkipProfile() for stack in ("encoder", "decoder")}
        drops = [s.layers for s in (self.encoder, self.decoder) if isinstance(s.layers, LayerDropModuleList)]
        saved_p = [d.p for d in drops]
        for stack, layers in self.skip_layers().items():
            for layer in layers:
                layer.profile = profiles[stack]
        for d in drops:
            d.p = 0.0
        try:
            super().forward(src_tokens, src_lengths, prev_output_tokens)
        finally:
            for d, p in zip(drops, saved_p):
                d.p = p
            for layers in self.skip_layers().values():
                for layer in layers:
                    layer.profile = None
        measured = profiles["encoder"].measured + profiles["decoder"].measured
        inits = [w_init for w_init, _ in measured]
        r_sq = mean_over_workers(torch.tensor([r * r for _, r in measured], device=inits[0].device))
        done = int(self.admin_profile[0])
        for w_init, r2 in zip(inits, r_sq):
            w_init.copy_(((done * w_init.float() ** 2 + r2) / (done + 1)).sqrt())
        self.admin_profile[0] += 1
        self._admin_done = done + 1 >= int(self.admin_profile[1])

        def fmt(stack):
            return " ".join("%.3f" % float(w_init.mean()) for w_init, _ in profiles[stack].measured)

        logger.info("Admin: w profiled on batch %d/%d (%d sentences): encoder %s; decoder %s",
                    done + 1, int(self.admin_profile[1]), src_tokens.size(0), fmt("encoder"), fmt("decoder"))
