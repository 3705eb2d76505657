"""Text backbones: token ids (B, L) int64 → logits (B, K).

- ``text_transformer`` (family ``transformer``): a small transformer encoder trained from
  scratch: token and learned position embeddings, ``depth`` pre-LN encoder blocks
  (``nn.LayerNorm`` before attention and before the MLP, as in Xiong et al. 2020 / ViT), a final
  LayerNorm, mean pooling over the non-padding tokens (or the first token, ``pooling: cls``; the
  word-level tokeniser prepends ``[CLS]``), dropout and a linear head. Attention is
  ``F.scaled_dot_product_attention`` with the padding mask; dropout lives in ``nn.Dropout``
  modules (embeddings, both residual branches, before the head) so that MC Dropout's wrapper
  finds and keeps them on. Packed-Ensembles and BatchEnsemble rebuild it from their layers
  (``methods/_tu/text.py``).
- ``hf_encoder`` (family ``pretrained_transformer``): a pre-trained encoder from
  ``transformers`` (``AutoModel.from_pretrained`` of ``model:``, a Hub name in the local cache or
  a ``save_pretrained`` folder; never downloads) with a fresh linear head on its pooled output
  (``pooler_output`` where the model has a pooler, as ``BertForSequenceClassification``; else the
  first token's hidden state). Its LayerNorms are plain ``nn.LayerNorm`` modules, which σN-Ens's
  converter replaces; the attention mask is built from the pad id of the model's config. The
  module says ``pretrained_weights = True``: a σN-Ens built on it converts the loaded weights
  preserving their outputs (``methods/_sigma/norm_ensemble.py``), as for ``pretrained: PATH``.

Both read ``dropout_rate`` (MC Dropout sets it). Their input is the token ids a text dataset
yields (``harness/data/_machinery/text.py``); the tokeniser must be the one the encoder was
trained with, which the dataset's name says (``sst2`` word-level, ``sst2_bert``
``bert-base-uncased``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.backbones import BackboneSpec, _no_extra, register_backbone
from harness.data._machinery.text import WORD_VOCAB_SIZE

FAMILY = "transformer"
# A pre-trained encoder's architecture is the library's: methods that rebuild the network from
# their own layers (Packed-Ensembles, BatchEnsemble) cannot, so it is a family of its own.
PRETRAINED_FAMILY = "pretrained_transformer"
POOLINGS = ("mean", "cls")


class EncoderBlock(nn.Module):
    """Pre-LN transformer encoder block: x + drop(attn(LN(x))), then x + drop(mlp(LN(x))).

    Args:
        dim: model width D.
        heads: attention heads (D must be divisible by it).
        mlp_ratio: hidden width of the MLP over D.
        dropout: rate of the residual-branch and MLP dropouts.
        linear: ``linear(f_in, f_out)`` → module (nn.Linear; BatchEnsemble's rank-1 layers).
    """

    def __init__(
        self, dim: int, heads: int, mlp_ratio: float, dropout: float, linear: Any = nn.Linear
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = linear(dim, 3 * dim)
        self.proj = linear(dim, dim)
        self.drop1 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), linear(hidden, dim)
        )
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        """Args: x (B, L, D); keep (B, 1, 1, L) bool, True where a key is a real token."""
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, L, D/H)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, H, L, D/H)
        x = x + self.drop1(self.proj(att.transpose(1, 2).reshape(b, n, d)))
        return x + self.drop2(self.mlp(self.norm2(x)))  # (B, L, D)


class TextTransformer(nn.Module):
    """Small transformer encoder for token ids, trained from scratch.

    Args:
        seq_len: L, the number of position embeddings.
        num_classes: K.
        vocab_size: embedding rows; must exceed every id the dataset yields.
        dim / depth / heads / mlp_ratio: width, blocks, heads, MLP ratio.
        dropout_rate: embedding, residual, MLP and head dropout.
        pooling: "mean" over non-padding tokens, or "cls" (the first token).
        pad_id: id of the padding token (masked out of attention and pooling).
        linear: ``linear(f_in, f_out)`` → module for every linear layer (default nn.Linear), so
            a comparator builds its variant of the same network (``methods/_tu/text.py``).
    """

    def __init__(
        self,
        seq_len: int,
        num_classes: int,
        vocab_size: int = WORD_VOCAB_SIZE,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout_rate: float = 0.0,
        pooling: str = "mean",
        pad_id: int = 0,
        linear: Any = nn.Linear,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.pad_id, self.pooling = pad_id, pooling
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Parameter(torch.zeros(1, seq_len, dim))
        self.drop = nn.Dropout(dropout_rate)
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, heads, mlp_ratio, dropout_rate, linear) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head_drop = nn.Dropout(dropout_rate)
        self.head = linear(dim, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """BERT/ViT initialisation: N(0, 0.02²) weights (truncated at 2σ), zero biases."""
        for mod in self.modules():
            if isinstance(mod, nn.Linear | nn.Embedding):
                nn.init.trunc_normal_(mod.weight, std=0.02, a=-0.04, b=0.04)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)
        nn.init.trunc_normal_(self.positions, std=0.02, a=-0.04, b=0.04)

    def forward(self, ids: Tensor) -> Tensor:
        """Args: ids (B, L) int64. Returns: logits (B, K)."""
        keep = ids != self.pad_id  # (B, L)
        x = self.drop(self.tokens(ids) + self.positions[:, : ids.shape[1]])  # (B, L, D)
        mask = keep[:, None, None, :]  # (B, 1, 1, L): queries attend to real tokens only
        for block in self.blocks:
            x = block(x, mask)
        x = self.norm(x)  # (B, L, D)
        if self.pooling == "cls":
            pooled = x[:, 0]  # (B, D)
        else:
            w = keep.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
            pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (B, D)
        return self.head(self.head_drop(pooled))  # (B, K)


class PretrainedTextEncoder(nn.Module):
    """A ``transformers`` encoder (loaded locally) with a linear classification head.

    Args:
        model: Hub name (read from the local cache) or folder of ``save_pretrained``.
        num_classes: K.
        dropout_rate: None keeps the model's own dropout; a rate replaces its hidden dropout
            (``hidden_dropout_prob`` / ``dropout`` of the config) and the head's.

    Raises:
        OSError: the weights are not on this machine (one line naming what to fetch).
    """

    #: The weights are pre-trained: σN-Ens converts them preserving the outputs.
    pretrained_weights = True

    def __init__(self, model: str, num_classes: int, dropout_rate: float | None = None) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel

        try:
            config = AutoConfig.from_pretrained(model, local_files_only=True)
        except OSError as err:
            raise OSError(
                f"hf_encoder: {model!r} is not on this machine "
                f"({' '.join(str(err).split())[:160]});"
                f' fetch it where there is internet with `python -c "from transformers import '
                f"AutoModel, AutoTokenizer as T; AutoModel.from_pretrained('{model}'); "
                f"T.from_pretrained('{model}')\"` and copy the Hugging Face cache ($HF_HOME) "
                "here, or give a local folder"
            ) from None
        if dropout_rate is not None:
            for key in ("hidden_dropout_prob", "dropout", "hidden_dropout"):
                if hasattr(config, key):
                    setattr(config, key, dropout_rate)
        self.encoder = AutoModel.from_pretrained(model, config=config, local_files_only=True)
        self.pad_id = int(config.pad_token_id if config.pad_token_id is not None else 0)
        rate = dropout_rate
        if rate is None:
            rate = getattr(config, "classifier_dropout", None)
            rate = getattr(config, "hidden_dropout_prob", 0.1) if rate is None else rate
        self.drop = nn.Dropout(rate)
        self.head = nn.Linear(config.hidden_size, num_classes)
        nn.init.normal_(self.head.weight, std=getattr(config, "initializer_range", 0.02))
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: Tensor) -> Tensor:
        """Args: ids (B, L) int64. Returns: logits (B, K)."""
        out = self.encoder(input_ids=ids, attention_mask=(ids != self.pad_id).long())
        pooled = getattr(out, "pooler_output", None)
        if pooled is None:
            pooled = out.last_hidden_state[:, 0]  # (B, D): the first ([CLS]/<s>) token
        return self.head(self.drop(pooled))  # (B, K)


def _text_transformer(
    in_shape: tuple[int, ...], num_classes: int, dropout_rate: float = 0.0, **kw: Any
) -> TextTransformer:
    if len(in_shape) != 1:
        raise ValueError(f"text_transformer takes token ids (L,), got input shape {in_shape}")
    allowed = {"vocab_size", "dim", "depth", "heads", "mlp_ratio", "pooling", "pad_id"}
    _no_extra({k: v for k, v in kw.items() if k not in allowed}, "text_transformer")
    return TextTransformer(in_shape[0], num_classes, dropout_rate=dropout_rate, **kw)


def _hf_encoder(
    in_shape: tuple[int, ...],
    num_classes: int,
    model: str = "bert-base-uncased",
    dropout_rate: float | None = None,
    **kw: Any,
) -> PretrainedTextEncoder:
    if len(in_shape) != 1:
        raise ValueError(f"hf_encoder takes token ids (L,), got input shape {in_shape}")
    _no_extra(kw, "hf_encoder")
    return PretrainedTextEncoder(model, num_classes, dropout_rate)


register_backbone(
    BackboneSpec(
        "text_transformer",
        _text_transformer,
        FAMILY,
        "pre-LN transformer encoder for token ids, trained from scratch (128-d, 4 blocks)",
    )
)
register_backbone(
    BackboneSpec(
        "hf_encoder",
        _hf_encoder,
        PRETRAINED_FAMILY,
        "pre-trained transformers encoder (model: Hub name or folder, local) + linear head",
    )
)
