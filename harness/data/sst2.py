"""SST-2 (GLUE) sentiment classification and its text OOD partners, as token-id splits.

**SST-2** is read from GLUE's published layout, ``<data_root>/SST-2/{train,dev,test}.tsv``
(``harness data download sst2`` fetches and extracts GLUE's ``SST-2.zip``): tab-separated with
the header ``sentence\\tlabel`` (0 = negative, 1 = positive), K = 2. GLUE's own test split has
no labels (``index\\tsentence``), so the harness's **test split is GLUE dev** (872 sentences,
what every SST-2 number in the literature reports), and its training pool is GLUE train
(67,349 phrases); a recipe's ``validation: n`` holds n of them out.

**OOD partners** (Hendrycks et al., "Pretrained Transformers Improve Out-of-Distribution
Robustness", ACL 2020, §5: SST-2 in-distribution against 20 Newsgroups, Multi30K, RTE, SNLI and
WMT16; Zhou et al., "Contrastive Out-of-Distribution Detection for Pretrained Transformers",
EMNLP 2021, the same protocol):

- ``20newsgroups``: the "bydate" release's test split, ``<root>/20news-bydate-test/<group>/<id>``
  (7,532 posts, Latin-1), each post without its header block (everything before the first
  blank line: the ``Newsgroups:``/``Subject:`` lines would give the topic away): far OOD (topic
  and register differ).
- ``imdb``: Maas et al. 2011's test reviews, ``<root>/aclImdb/test/{pos,neg}/*.txt`` (25,000;
  ``<br />`` tags become spaces): near OOD, a domain shift (long movie reviews against short
  phrases) within the same label space; Hendrycks et al. use it as SST-2's shifted test set.

Files are read in sorted path order (deterministic) and every text is tokenised to the same
:data:`harness.data._machinery.text.SEQ_LEN` tokens as SST-2 (the model's position embeddings
fix L).

**Tokeniser.** A token id only means something to the tokeniser that made it, so a text dataset
is registered once per tokeniser by :func:`register_text_datasets`, one general mechanism:
the plain names (``sst2``, ``20newsgroups``, ``imdb``) use the word-level vocabulary built from
SST-2's training split (for ``text_transformer``, trained from scratch), and the ``_bert``
names (``sst2_bert``, ...) use ``bert-base-uncased``'s tokeniser (for ``hf_encoder`` with its
default ``model: bert-base-uncased``). Another pre-trained encoder registers its names from a
plugin module (``--plugin``)::

    from harness.data.sst2 import register_text_datasets
    register_text_datasets("_roberta", "hf:roberta-base")

A grid crosses every dataset with every backbone, so a suite runs one tokeniser (see
``docs/text.md``); OOD sets must use the in-distribution set's tokeniser (same suffix).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import torch

from harness.data._machinery.base import DatasetSpec, register_dataset
from harness.data._machinery.sources import Archive, Archives
from harness.data._machinery.text import SEQ_LEN, WORD, TextSplit, Tokenizer, make_tokenizer

SST2_DIR = "SST-2"
NEWSGROUPS_DIR = "20news-bydate-test"
IMDB_DIR = "aclImdb"
#: The published archives: GLUE's SST-2 (md5 as torchtext's SST2), Maas et al.'s IMDB
#: (torchtext's IMDB md5), 20 Newsgroups "bydate" (the md5 its distributors publish).
ARCHIVES = {
    "sst2": Archive(
        "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip", "9f81648d4199384278b86e315dac217c"
    ),
    "imdb": Archive(
        "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
        "7c2ac02c03563afcf9b574c7e56c153a",
    ),
    "20newsgroups": Archive(
        "http://qwone.com/~jason/20Newsgroups/20news-bydate.tar.gz",
        "d6e9e45cb8cb77ec5276dfa6dfc14318",
    ),
}
# Token ids are not normalised; mean/std only fill the spec's image fields.
_NO_NORM: tuple[float, ...] = ()


def _sst2_folder(root: Path) -> Path:
    return Path(root).expanduser() / SST2_DIR


def read_glue_tsv(path: Path) -> tuple[list[str], torch.Tensor]:
    """Sentences and int64 labels of a labelled GLUE SST-2 file (header ``sentence\\tlabel``).

    Lines are split on the tab by hand, not with a CSV reader: GLUE's SST-2 sentences contain
    unbalanced double quotes that a quoting-aware reader would merge across lines.

    Raises:
        ValueError: the header is not ``sentence\\tlabel`` or a line is malformed (names the line).
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != ["sentence", "label"]:
        head = lines[0] if lines else ""
        raise ValueError(f"{path}: expected the header 'sentence<TAB>label', got {head!r}")
    texts, labels = [], []
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        sentence, sep, label = line.rpartition("\t")
        if not sep or label.strip() not in ("0", "1"):
            raise ValueError(f"{path}:{i}: expected 'sentence<TAB>0|1', got {line[:80]!r}")
        texts.append(sentence.strip())
        labels.append(int(label))
    return texts, torch.tensor(labels, dtype=torch.int64)


def read_newsgroups(folder: Path) -> list[str]:
    """Posts of ``20news-bydate-test/<group>/<id>`` without their header block (sorted)."""
    texts = []
    for path in sorted(p for p in Path(folder).glob("*/*") if p.is_file()):
        raw = path.read_text(encoding="latin-1")  # the release is Latin-1
        _, sep, body = raw.partition("\n\n")
        texts.append(" ".join((body if sep else raw).split()))
    return texts


def read_imdb(folder: Path) -> list[str]:
    """Reviews of ``aclImdb/test/{pos,neg}/*.txt`` (sorted), ``<br />`` tags as spaces."""
    paths = sorted(p for label in ("neg", "pos") for p in (Path(folder) / label).glob("*.txt"))
    return [" ".join(p.read_text(encoding="utf-8").replace("<br />", " ").split()) for p in paths]


@lru_cache(maxsize=4)
def _tokenizer(kind: str, root: str) -> Tokenizer:
    """The tokeniser ``kind`` for the data under ``root`` (word-level: SST-2 train's vocabulary,
    so OOD sets share the in-distribution ids)."""
    train_texts: list[str] = []
    if kind == WORD:
        train_texts, _ = read_glue_tsv(Path(root) / SST2_DIR / "train.tsv")
    return make_tokenizer(kind, train_texts)


@lru_cache(maxsize=4)
def _load_sst2(root: str, kind: str) -> dict[str, TextSplit]:
    tok = _tokenizer(kind, root)
    out = {}
    for split, file in (("train", "train.tsv"), ("test", "dev.tsv")):  # test = GLUE dev
        texts, labels = read_glue_tsv(Path(root) / SST2_DIR / file)
        out[split] = TextSplit(tok(texts, SEQ_LEN), labels)
    return out


@lru_cache(maxsize=4)
def _load_ood(root: str, kind: str, name: str) -> dict[str, TextSplit]:
    reader, folder = _OOD[name]
    texts = reader(folder(Path(root)))
    labels = torch.full((len(texts),), -1, dtype=torch.int64)
    return {"test": TextSplit(_tokenizer(kind, root)(texts, SEQ_LEN), labels)}


def _resolved(root: Path) -> str:
    return str(Path(root).expanduser().resolve())


def _sst2_available(root: Path) -> bool:
    folder = _sst2_folder(root)
    return (folder / "train.tsv").is_file() and (folder / "dev.tsv").is_file()


_OOD: dict[str, tuple[Callable[[Path], list[str]], Callable[[Path], Path]]] = {
    "20newsgroups": (read_newsgroups, lambda root: Path(root).expanduser() / NEWSGROUPS_DIR),
    "imdb": (read_imdb, lambda root: Path(root).expanduser() / IMDB_DIR / "test"),
}
_OOD_ABOUT = {
    "20newsgroups": "20 Newsgroups bydate test posts (20news-bydate-test/), headers stripped",
    "imdb": "IMDB test reviews (aclImdb/test/{pos,neg}/)",
}


def _ood_available(name: str) -> Callable[[Path], bool]:
    def available(root: Path) -> bool:
        folder = _OOD[name][1](root)
        return folder.is_dir() and any(folder.iterdir()) and _sst2_available(root)

    return available


def register_text_datasets(suffix: str, tokenizer: str) -> list[str]:
    """Register SST-2 and its OOD partners tokenised by ``tokenizer`` as ``<name><suffix>``.

    Args:
        suffix: appended to every name ("" for the word-level built-ins, e.g. "_bert").
        tokenizer: ``"word"`` or ``"hf:<name or path>"`` (see :mod:`harness.data._machinery.text`).

    Returns:
        The registered names.
    """
    about = "word-level vocabulary of SST-2 train" if tokenizer == WORD else tokenizer
    names = [f"sst2{suffix}"]
    register_dataset(
        DatasetSpec(
            name=names[0],
            in_shape=(SEQ_LEN,),
            num_classes=2,
            mean=_NO_NORM,
            std=_NO_NORM,
            load=lambda root: _load_sst2(_resolved(root), tokenizer),
            location=_sst2_folder,
            fetch="harness data download sst2",
            download=Archives((ARCHIVES["sst2"],)),
            description=f"GLUE SST-2 (train; test = GLUE dev), {SEQ_LEN} tokens, {about}",
            is_available=_sst2_available,
        )
    )
    for ood in _OOD:
        names.append(f"{ood}{suffix}")
        register_dataset(
            DatasetSpec(
                name=names[-1],
                in_shape=(SEQ_LEN,),
                num_classes=None,
                mean=_NO_NORM,
                std=_NO_NORM,
                load=lambda root, o=ood: _load_ood(_resolved(root), tokenizer, o),
                location=_OOD[ood][1],
                fetch=f"harness data download {ood} sst2",
                download=Archives((ARCHIVES[ood],)),
                description=f"OOD for SST-2: {_OOD_ABOUT[ood]}, {SEQ_LEN} tokens, {about}",
                is_available=_ood_available(ood),
            )
        )
    return names


register_text_datasets("", WORD)
register_text_datasets("_bert", "hf:bert-base-uncased")
