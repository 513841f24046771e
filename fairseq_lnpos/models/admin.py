"""Admin (Liu et al., EMNLP 2020, "Understanding the Difficulty of Training Transformers",
arXiv 2004.08249), as in its official code (LiyuanLucasLiu/Transformer-Clinic,
``fairseq/fairseq/modules/transformer_layer.py``, ``--init-type adaptive-profiling`` / ``adaptive``).

Each sublayer computes ``x_i = LN(w_i * x_{i-1} + F_i(x_{i-1}))``: fairseq's Post-LN layer with the
skip scaled element-wise by ``w_i``, a trainable vector of ``embed_dim`` entries (an ``nn.Parameter``,
as in the official code; weight decay applies to it like to every other parameter). All other
weights keep fairseq's initialisation, as for Post-LN.

``w`` is set at initialisation by a profiling forward pass on a training batch (training mode, so
with dropout, and without gradients), per stack, sublayer by sublayer in forward order::

    r_1 = 1,   w_i = r_i,   r_{i+1} = sqrt(Var[w_i * x_{i-1}] + Var[F_i(x_{i-1})])

with ``Var`` the population variance over every element of the (time x batch x dim) tensor,
padding positions included, and ``F_i`` the sublayer's output after dropout; the encoder and the
decoder each start at ``r_1 = 1``. Since ``x_{i-1}`` is a LayerNorm output for i > 1 (variance 1 at
initialisation), this is the paper's ``w_i^2 = sum_{j<i} Var[F_j]`` plus the embedding's variance.

Where the official code differs, or is silent:

* The official code profiles in a separate run (one batch, then exit) that writes a file the
  training run reads. Here the model profiles itself lazily: the first training-mode forward of a
  model built from scratch first runs the profiling pass on its own batch, then the real forward
  with the profiled ``w``. ``--admin-profile-batches K`` (default 1, as the official code) profiles
  the first K training-mode forwards: each sets ``w^2`` to the mean of the ``r^2`` measured so far,
  so batches 2..K are measured after the updates in between (use K > 1 only with that in mind);
  0 keeps ``w = 1`` (Post-LN with a trainable skip scale). Why lazily: fairseq builds the model
  (``build_model``) before it loads a checkpoint and before it loads the training data, in
  fairseq-train, fairseq-generate and the Fig. 3 analysis alike, so only the first training-mode
  forward knows both that the model is trained and what a training batch is.
* The number of batches profiled (and K) is a buffer in the state dict, ``admin_profile =
  [done, K]``: a checkpoint (fairseq-generate, ``--restore-file``, resuming) loads ``done = K`` and
  never profiles again.
* With several workers the ``r^2`` are averaged over all workers before they are used, so every
  replica starts from the same ``w``; LayerDrop is off during the profiling pass.
* Each profiled batch is logged: ``Admin: w profiled on batch 1/1: encoder ...; decoder ...``.

The skip costs one ``torch.addcmul`` per sublayer, the same operator count as fairseq's
``residual + x``.
"""
import logging
import math

from fairseq.models import register_model
from fairseq.modules import LayerDropModuleList
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
import torch
from torch import nn

from ..errors import check
from .variant import VariantTransformerModel

logger = logging.getLogger(__name__)


class SkipProfile:
    """One stack's profiling recursion: ``w_i = r_i``, ``r_{i+1} = sqrt(Var[w_i x] + Var[F_i])``."""

    def __init__(self):
        self.ratio = 1.0
        self.measured = []  # (skip parameter, r_i), in forward order

    def step(self, skip, branch, residual):
        w = self.ratio
        self.measured.append((skip, w))
        var = (residual.float() * w).var(unbiased=False) + branch.float().var(unbiased=False)
        self.ratio = math.sqrt(float(var))
        return w


class AdminLayer:
    """fairseq's Post-LN layer with the k-th ``residual_connection`` of a forward scaled by ``w_k``."""

    profile = None  # a SkipProfile while the model profiles

    def admin_init(self, sublayers):
        self.skip_names = [f"{name}_skip" for name in sublayers]
        for name in self.skip_names:
            setattr(self, name, nn.Parameter(torch.ones(self.embed_dim)))
        self._sublayer = 0

    def forward(self, *args, **kwargs):
        self._sublayer = 0  # fairseq's forward calls residual_connection once per sublayer, in order
        return super().forward(*args, **kwargs)

    def residual_connection(self, x, residual):  # fairseq: residual + x
        skip = getattr(self, self.skip_names[self._sublayer])
        self._sublayer += 1
        if self.profile is not None:
            return x + self.profile.step(skip, x, residual) * residual
        return torch.addcmul(x, residual, skip)


class AdminEncoderLayer(AdminLayer, TransformerEncoderLayerBase):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.admin_init(["self_attn", "ffn"])


class AdminDecoderLayer(AdminLayer, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.admin_init(["self_attn"] + ([] if self.encoder_attn is None else ["encoder_attn"]) + ["ffn"])


def mean_over_workers(t):
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
        t /= torch.distributed.get_world_size()
    return t


@register_model("transformer_admin")
class AdminTransformerModel(VariantTransformerModel):
    encoder_layer_cls = AdminEncoderLayer
    decoder_layer_cls = AdminDecoderLayer

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--admin-profile-batches", type=int, default=1, metavar="K",
                            help="training batches whose forward pass sets Admin's skip weights w "
                                 "(the first K training-mode forwards of a model built from scratch; "
                                 "0: w = 1)")

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        k = getattr(args, "admin_profile_batches", 1)
        check(k >= 0, f"--admin-profile-batches must be 0 or more, got {k}")
        self.register_buffer("admin_profile", torch.tensor([0, k]))  # [batches profiled, batches to profile]
        self._admin_done = k == 0

    def load_state_dict(self, *args, **kwargs):
        self._admin_done = False  # read admin_profile again at the next training-mode forward
        return super().load_state_dict(*args, **kwargs)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        if self.training and not self._admin_done:
            done, total = self.admin_profile.tolist()
            self._admin_done = done >= total
            if not self._admin_done:
                self.profile_skips(src_tokens, src_lengths, prev_output_tokens)
        return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)

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
        skips = [skip for skip, _ in measured]
        r_sq = mean_over_workers(torch.tensor([r * r for _, r in measured], device=skips[0].device))
        done = int(self.admin_profile[0])
        for skip, r2 in zip(skips, r_sq):
            skip.copy_(((done * skip.float() ** 2 + r2) / (done + 1)).sqrt())
        self.admin_profile[0] += 1
        self._admin_done = done + 1 >= int(self.admin_profile[1])

        def fmt(stack):
            return " ".join("%.3f" % float(skip.mean()) for skip, _ in profiles[stack].measured)

        logger.info("Admin: w profiled on batch %d/%d (%d sentences): encoder %s; decoder %s",
                    done + 1, int(self.admin_profile[1]), src_tokens.size(0), fmt("encoder"), fmt("decoder"))
