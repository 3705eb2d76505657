"""Token-id splits for text classification: tokenisers, the in-memory split and its loader.

A text split is a :class:`~harness.data._machinery.base.LazySplit` (it is not an image set)
holding int64 token ids (N, L), padded or truncated to ``L``, and int64 labels (N,). Its loader
yields ``(ids (B, L) on the device, labels (B,))`` in an order fixed by (seed, epoch, stream),
exactly as :class:`harness.data._machinery.loader.DeviceLoader` orders images, so a text cell and
an image cell of the same seed see their data the same way; ``shard=(rank, world)`` yields a
rank's contiguous block of every global batch.

Tokenisers (:func:`make_tokenizer`), named by a string so that a dataset's registration says
which one it uses:

- ``"word"``: a word-level vocabulary built from the **training split only** with Hugging Face
  ``tokenizers`` (``WordLevel`` model + ``WordLevelTrainer``; BERT's normaliser: lower case,
  accents stripped; split on whitespace and punctuation). Ids: ``[PAD]`` = 0, ``[UNK]`` = 1,
  ``[CLS]`` = 2 (prepended to every sequence), then words by decreasing training frequency (ties
  by the trainer's order, which is deterministic), capped at :data:`WORD_VOCAB_SIZE`. This is
  the from-scratch encoder's tokeniser (``text_transformer``'s default ``vocab_size`` matches).
- ``"hf:<name or path>"``: a pre-trained encoder's own tokeniser through
  ``transformers.AutoTokenizer.from_pretrained(..., local_files_only=True)`` (a Hub name read from
  the local Hugging Face cache, or a folder written by ``save_pretrained``); nothing downloads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from harness.data._machinery.base import DataMissingError, LoaderOptions, OptionsLoader

#: Tokens per sequence. SST-2 items are single sentences or phrases (reported at about 19 words
#: on average; the real files are not on the machine this was written on, so the share that is
#: truncated is not measured here); longer OOD texts (IMDB, newsgroups) are truncated to the
#: same L, as the model's position embeddings require.
SEQ_LEN = 64
#: Cap of the word-level vocabulary, special tokens included (SST-2's training split has about
#: 15k distinct lower-cased words by published counts, so all should be kept; unmeasured here);
#: ``text_transformer``'s default embedding size.
WORD_VOCAB_SIZE = 20_000
PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"
WORD = "word"
HF_PREFIX = "hf:"


class Tokenizer(Protocol):
    """Sentences → int64 ids (N, L), padded with :attr:`pad_id` and truncated to L."""

    pad_id: int
    vocab_size: int

    def __call__(self, texts: Sequence[str], length: int) -> Tensor: ...


class WordTokenizer:
    """Word-level tokeniser trained on a list of sentences (see the module docstring).

    Args:
        train_texts: the training split's sentences (the only text the vocabulary sees).
        vocab_size: cap of the vocabulary, special tokens included.
    """

    pad_id = 0

    def __init__(self, train_texts: Sequence[str], vocab_size: int = WORD_VOCAB_SIZE) -> None:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

        tok = HFTokenizer(models.WordLevel(unk_token=UNK))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # whitespace and punctuation
        trainer = trainers.WordLevelTrainer(
            vocab_size=vocab_size, special_tokens=[PAD, UNK, CLS], show_progress=False
        )
        tok.train_from_iterator(list(train_texts), trainer)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A", special_tokens=[(CLS, tok.token_to_id(CLS))]
        )
        self.tokenizer = tok
        self.vocab_size = tok.get_vocab_size()

    def __call__(self, texts: Sequence[str], length: int) -> Tensor:
        self.tokenizer.enable_truncation(length)
        self.tokenizer.enable_padding(pad_id=self.pad_id, pad_token=PAD, length=length)
        # encode_batch_fast skips the character offsets we never read (tokenizers >= 0.20)
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return _as_ids([e.ids for e in encode(list(texts))], length)


class PretrainedTokenizer:
    """A pre-trained encoder's tokeniser (``transformers.AutoTokenizer``), read locally.

    Args:
        name: Hub name (looked up in the local cache) or folder (``save_pretrained``).

    Raises:
        DataMissingError: the tokeniser files are not on this machine (one line).
    """

    def __init__(self, name: str) -> None:
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except OSError as err:
            raise DataMissingError(
                f"tokenizer {name!r} is not on this machine ({' '.join(str(err).split())[:200]}); "
                f'fetch it where there is internet with `python -c "from transformers import '
                f"AutoTokenizer; AutoTokenizer.from_pretrained('{name}')\"` and copy the "
                "Hugging Face cache ($HF_HOME) here, or give a local folder"
            ) from None
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer {name!r} has no padding token; give one that pads")
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.vocab_size = len(self.tokenizer)

    def __call__(self, texts: Sequence[str], length: int) -> Tensor:
        if not texts:  # the tokenizer refuses an empty batch
            return _as_ids([], length)
        enc = self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=length)
        return _as_ids(enc["input_ids"], length)


def _as_ids(rows: list[list[int]], length: int) -> Tensor:
    if not rows:
        return torch.zeros((0, length), dtype=torch.int64)
    return torch.from_numpy(np.asarray(rows, dtype=np.int64))  # (N, L); 5× torch.tensor's speed


def make_tokenizer(kind: str, train_texts: Sequence[str]) -> Tokenizer:
    """The tokeniser named ``kind`` (``"word"`` or ``"hf:<name or path>"``).

    Args:
        kind: see the module docstring.
        train_texts: the training sentences (the word-level vocabulary is built from them).
    """
    if kind == WORD:
        return WordTokenizer(train_texts)
    if kind.startswith(HF_PREFIX) and kind[len(HF_PREFIX) :].strip():
        return PretrainedTokenizer(kind[len(HF_PREFIX) :].strip())
    raise ValueError(f"tokenizer must be 'word' or 'hf:<name or path>', got {kind!r}")


@dataclass(frozen=True)
class TextSplit:
    """Token ids and labels of one text split (a :class:`~harness.data._machinery.base.LazySplit`).

    Attributes:
        ids: int64 (N, L) token ids, padded with the tokeniser's pad id.
        labels: int64 (N,); -1 for OOD sets.
    """

    ids: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        if self.ids.dtype != torch.int64 or self.ids.dim() != 2:
            raise TypeError(
                f"ids must be int64 (N, L), got {self.ids.dtype} {tuple(self.ids.shape)}"
            )
        if len(self.ids) != len(self.labels):
            raise ValueError("ids and labels differ in length")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx: Tensor) -> TextSplit:
        """Rows ``idx`` (int64 indices) as a new split."""
        return TextSplit(self.ids[idx], self.labels[idx])

    def loader(self, options: LoaderOptions) -> TextLoader:
        """The split's loader (token ids carry no augmentation; see :class:`TextLoader`)."""
        return TextLoader(self, options)


class TextLoader(OptionsLoader):
    """Batches ``(ids (B, L) int64 on the device, labels (B,))`` of a :class:`TextSplit`.

    Order: a permutation drawn from a CPU generator seeded by (seed, epoch, stream) with the
    same formula as :class:`harness.data._machinery.loader.DeviceLoader` (so the order does not
    depend on the device or the world size), then sharded: rank r of w gets the rows
    ``[r·B/w, (r+1)·B/w)`` of every global batch (the last ranks one row fewer when w does not
    divide B). ``streams = S > 1`` yields (S, B, L) / (S, B), stream s from its own generator.

    Raises:
        ValueError: a training augmentation other than "none" (text has none).
    """

    def __init__(self, data: TextSplit, options: LoaderOptions) -> None:
        if options.train and options.augment != "none":
            raise ValueError(
                f"text splits have no augmentation; set the recipe's augment to 'none' or "
                f"'default', got {options.augment!r}"
            )
        self.options = options
        self.ids = data.ids.to(options.device)  # (N, L) int64: SST-2's 67k × 64 is 34 MB
        self.labels = data.labels.to(options.device)
        self.epoch = 0

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        o, n = self.options, len(self.labels)
        orders = [
            torch.randperm(n, generator=self.generator(s)) if o.shuffle else torch.arange(n)
            for s in range(o.streams)
        ]
        for i in range(len(self)):
            xs, ys = [], []
            for order in orders:
                idx = order[i * o.batch_size : (i + 1) * o.batch_size]
                lo, hi = self.block(len(idx))
                rows = idx[lo:hi].to(o.device)
                xs.append(self.ids[rows])  # (B_rank, L)
                ys.append(self.labels[rows])
            if o.streams == 1:
                yield xs[0], ys[0]
            else:
                yield torch.stack(xs), torch.stack(ys)  # (S, B_rank, L), (S, B_rank)
