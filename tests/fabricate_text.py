"""Tiny text datasets in their published on-disk layouts (GLUE SST-2, 20 Newsgroups "bydate",
IMDB), for the SST-2 tests and the shipped-suites validation test."""

from __future__ import annotations

from pathlib import Path

POS = ["a good movie", "great fun , truly great", "the best film of the year", "good acting"]
NEG = ["a bad movie", "awful , just awful", 'the worst "film" ever', "dull and boring"]


def write_sst2(root: Path, repeat: int = 4) -> Path:
    """GLUE's SST-2 layout: train/dev with ``sentence\\tlabel``, test with ``index\\tsentence``."""
    folder = root / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(s, 1) for s in POS] + [(s, 0) for s in NEG]
    train = [f"{s} {i}\t{y}" for i in range(repeat) for s, y in rows]
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(train) + "\n")
    dev = [f"{s} !\t{y}" for s, y in rows]
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(dev) + "\n")
    test = [f"{i}\t{s}" for i, (s, _) in enumerate(rows)]
    (folder / "test.tsv").write_text("index\tsentence\n" + "\n".join(test) + "\n")
    return folder


def write_ood(root: Path) -> None:
    """20 Newsgroups bydate test and IMDB test trees, a few documents each."""
    for group, ids in (("sci.space", ["60001", "60002"]), ("rec.autos", ["70001"])):
        folder = root / "20news-bydate-test" / group
        folder.mkdir(parents=True, exist_ok=True)
        for i in ids:
            post = f"From: x@y.edu\nSubject: orbit {i}\n\nThe shuttle r\xe9entry burns {i}.\n"
            (folder / i).write_bytes(post.encode("latin-1"))
    for label, stars in (("pos", 9), ("neg", 2)):
        folder = root / "aclImdb" / "test" / label
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            (folder / f"{i}_{stars}.txt").write_text(f"A {label} review.<br /><br />Movie {i}.")


def write_for_suites(root: Path) -> None:
    """Everything the shipped text suites (sst2, sst2_bert) validate against."""
    write_sst2(root)
    write_ood(root)
