"""A fairseq ``transformer`` whose encoder and decoder layers are plugin layer classes.

Only the layer class differs from fairseq's model: options, embeddings, generation and
checkpoints are fairseq's own.
"""
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper


def without_fused_inference(module):
    """Keep every encoder layer in ``module`` off upstream fairseq 0.12.2's fused inference path.

    Upstream 0.12.2 runs a Post-LN encoder layer that was loaded from a checkpoint, in eval mode,
    through torch's ``_transformer_encoder_layer_fwd``. That kernel computes plain Post-LN (wrong
    for DeepNorm's scaled skip and Keel's extra LayerNorms) and, with torch >= 2.0, fails on padded
    batches ("Mask Type should be defined", fairseq issue 4858) for fairseq's own Post-LN too.
    fairseq-fixed 0.12.3.1 has no such path, and the attribute set here is then unused.
    """
    for m in module.modules():
        if hasattr(m, "can_use_fastpath"):
            m.can_use_fastpath = False
    return module


def wrap_like_fairseq(layer, cfg):
    """Activation checkpointing and FSDP, with the policy fairseq applies to its own layers."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


class VariantEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, layer_cls, return_fc=False):
        self.layer_cls, self._built = layer_cls, 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        layer = without_fused_inference(self.layer_cls(cfg, index=self._built, return_fc=self.return_fc))
        self._built += 1
        return wrap_like_fairseq(layer, cfg)


class VariantDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, layer_cls, no_encoder_attn=False):
        self.layer_cls, self._built = layer_cls, 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = self.layer_cls(cfg, no_encoder_attn, index=self._built)
        self._built += 1
        return wrap_like_fairseq(layer, cfg)


class VariantTransformerModel(TransformerModel):
    """Subclasses set the two layer classes (constructed as ``cls(cfg, ..., index=i)``)."""

    encoder_layer_cls = None
    decoder_layer_cls = None

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return VariantEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens, cls.encoder_layer_cls)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return VariantDecoder(cfg, tgt_dict, embed_tokens, cls.decoder_layer_cls,
                              no_encoder_attn=cfg.no_cross_attention)
