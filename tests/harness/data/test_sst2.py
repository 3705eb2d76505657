"""SST-2 and text OOD sets in their published layouts, the token-id loader, the text backbones
and a tiny text suite run end to end through the real CLI on the CPU.

Fabricated here: a GLUE SST-2 tree (``SST-2/{train,dev,test}.tsv`` with GLUE's headers), the 20
Newsgroups "bydate" test tree (``20news-bydate-test/<group>/<id>``, Latin-1 posts with headers),
the IMDB test tree (``aclImdb/test/{pos,neg}/<id>_<rating>.txt`` with ``<br />`` tags) and a
tiny BERT (``transformers.BertConfig`` → ``save_pretrained``, tokenizer from a tiny vocabulary).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import tarfile
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from harness.data._machinery.base import DatasetSpec, LazySplit, LoaderOptions
from harness.data._machinery.text import SEQ_LEN, TextSplit, WordTokenizer, make_tokenizer
from harness.data.sst2 import read_glue_tsv, read_imdb, read_newsgroups, register_text_datasets
from harness.registry import DATASETS, METHODS
from methods._base import BuildContext
from tests.fabricate_text import NEG, POS, write_ood, write_sst2

CPU = torch.device("cpu")


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write_sst2(root)
    write_ood(root)
    return root


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, 16-wide BERT and its WordPiece tokenizer, saved as a local folder."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += sorted({w for s in POS + NEG for w in s.replace('"', "").split()} | {"!", '"'})
    folder = tmp_path_factory.mktemp("tiny_bert")
    config = BertConfig(
        vocab_size=len(words),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ_LEN,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}).save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------------------
# Readers and tokenisers


def test_glue_tsv_reader_keeps_quotes_and_labels(data_root: Path) -> None:
    texts, labels = read_glue_tsv(data_root / "SST-2" / "dev.tsv")
    assert texts[6] == 'the worst "film" ever !'  # an unbalanced CSV quote stays in its line
    assert labels.tolist() == [1, 1, 1, 1, 0, 0, 0, 0] and labels.dtype == torch.int64
    with pytest.raises(ValueError, match=r"expected the header 'sentence<TAB>label'"):
        read_glue_tsv(data_root / "SST-2" / "test.tsv")  # GLUE test: index, sentence; no labels
    bad = data_root / "bad.tsv"
    bad.write_text("sentence\tlabel\na fine line\t1\nno label here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:3: expected 'sentence<TAB>0\|1'"):
        read_glue_tsv(bad)


def test_ood_readers_strip_headers_and_tags(data_root: Path) -> None:
    posts = read_newsgroups(data_root / "20news-bydate-test")
    assert posts == [  # sorted by path: rec.autos before sci.space; header block removed
        "The shuttle r\xe9entry burns 70001.",
        "The shuttle r\xe9entry burns 60001.",
        "The shuttle r\xe9entry burns 60002.",
    ]
    reviews = read_imdb(data_root / "aclImdb" / "test")
    assert reviews[0] == "A neg review. Movie 0." and len(reviews) == 4


def test_word_tokenizer_is_built_from_train_only_and_pads_to_length() -> None:
    tok = WordTokenizer(["a good movie", "a bad movie", "good !"])
    vocab = tok.tokenizer.get_vocab()
    # specials first, then by training frequency (ties in the trainer's fixed order)
    assert [vocab[w] for w in ("[PAD]", "[UNK]", "[CLS]")] == [0, 1, 2]
    assert {vocab["a"], vocab["good"], vocab["movie"]} == {3, 4, 5} and tok.vocab_size == 8
    ids = tok(["A GOOD film", "good " * 10], 5)
    # [CLS] first, lower-cased, unseen word → [UNK], padded with 0 / truncated to 5
    assert ids.tolist() == [[2, vocab["a"], vocab["good"], 1, 0], [2] + [vocab["good"]] * 4]
    again = WordTokenizer(["a good movie", "a bad movie", "good !"])
    assert again.tokenizer.get_vocab() == vocab  # deterministic


def test_tokenizer_names_are_checked(tiny_bert: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer must be 'word' or 'hf:<name or path>'"):
        make_tokenizer("bpe", [])
    from harness.data._machinery.base import DataMissingError

    with pytest.raises(DataMissingError, match=r"tokenizer '/nonexistent/bert' is not on this"):
        make_tokenizer("hf:/nonexistent/bert", [])
    tok = make_tokenizer(f"hf:{tiny_bert}", [])
    ids = tok(["a good movie !"], 8)
    vocab = tok.tokenizer.get_vocab()
    expected = [vocab[w] for w in ("[CLS]", "a", "good", "movie", "!", "[SEP]")] + [0, 0]
    assert ids.tolist() == [expected] and tok.pad_id == 0
    assert tok([], 8).shape == (0, 8) and tok([], 8).dtype == torch.int64  # an empty OOD folder


def test_sst2_dataset_splits_are_lazy_token_ids(data_root: Path) -> None:
    spec: DatasetSpec = DATASETS.get("sst2")
    assert spec.in_shape == (SEQ_LEN,) and spec.num_classes == 2
    spec.require(data_root)
    splits = spec.load(data_root)
    train, test = splits["train"], splits["test"]
    assert isinstance(train, LazySplit) and isinstance(test, TextSplit)
    assert train.ids.shape == (32, SEQ_LEN) and test.ids.shape == (8, SEQ_LEN)  # test = GLUE dev
    assert test.labels.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    # dev's "!" never occurs in train: the word vocabulary saw train only, so it is [UNK]
    assert test.ids[0, :5].tolist()[-1] == 1 and test.ids[0, 0].item() == 2
    ood = DATASETS.get("20newsgroups").load(data_root)["test"]
    assert ood.ids.shape == (3, SEQ_LEN) and set(ood.labels.tolist()) == {-1}
    with pytest.raises(Exception, match=r"dataset 'imdb' not found: looked in"):
        DATASETS.get("imdb").require(data_root / "elsewhere")
    # a recipe's validation hold-out: stratified rows of the training pool, as for images
    from harness.data._machinery.base import training_splits

    held = training_splits(splits, 4)
    assert len(held["train"]) == 28 and held["val"].labels.tolist().count(1) == 2
    assert isinstance(held["val"], TextSplit) and held["val"].ids.shape == (4, SEQ_LEN)


# --------------------------------------------------------------------------------------------
# Loader


def test_loader_order_is_a_function_of_seed_epoch_and_stream() -> None:
    split = TextSplit(torch.arange(30).view(10, 3), torch.arange(10))
    opts = LoaderOptions(4, CPU, shuffle=True, seed=3, train=True)
    first = [y.tolist() for _, y in split.loader(opts)]
    assert first == [y.tolist() for _, y in split.loader(opts)]  # same seed, same order
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(3 * 100_003)).tolist()
    assert [i for batch in first for i in batch] == expected  # DeviceLoader's seeding
    later = split.loader(opts)
    later.set_epoch(1)
    assert [y.tolist() for _, y in later] != first
    x, y = next(iter(split.loader(LoaderOptions(4, CPU, shuffle=True, seed=3, streams=2))))
    assert x.shape == (2, 4, 3) and y[0].tolist() == expected[:4]  # stream 0 is the shared one
    assert torch.equal(x[1][:, 0] // 3, y[1])  # ids and labels stay paired
    unshuffled = [y.tolist() for _, y in split.loader(LoaderOptions(4, CPU))]
    assert unshuffled == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match=r"text splits have no augmentation"):
        split.loader(LoaderOptions(4, CPU, train=True, augment="crop_flip"))


def test_shards_are_contiguous_blocks_of_the_global_batch() -> None:
    split = TextSplit(torch.arange(20).view(10, 2), torch.arange(10))
    whole = [y.tolist() for _, y in split.loader(LoaderOptions(5, CPU, shuffle=True, seed=1))]
    ranks = [
        [
            y.tolist()
            for _, y in split.loader(LoaderOptions(5, CPU, shuffle=True, seed=1, shard=(r, 2)))
        ]
        for r in range(2)
    ]
    for b, batch in enumerate(whole):  # rank 0: rows [0, 3), rank 1: rows [3, 5)
        assert ranks[0][b] == batch[:3] and ranks[1][b] == batch[3:]
    assert len(split.loader(LoaderOptions(4, CPU, drop_last=True))) == 2
    sub = split.subset(torch.tensor([1, 4]))
    assert sub.labels.tolist() == [1, 4] and sub.ids.tolist() == [[2, 3], [8, 9]]


# --------------------------------------------------------------------------------------------
# Backbones and methods on token ids


TEXT_METHODS = [
    "single",
    "sigma_ens",
    "film_ensemble",
    "deep_ensemble",
    "mc_dropout",
    "packed_ensemble",
    "batch_ensemble",
]


@pytest.mark.parametrize("method", TEXT_METHODS)
def test_methods_train_on_token_ids(method: str) -> None:
    spec = METHODS.get(method)
    kw = {"dim": 16, "depth": 1, "heads": 2, "vocab_size": 50}
    m = spec.min_members if spec.max_members == 1 else 2
    ctx = BuildContext("text_transformer", (12,), 3, m, kw, seed=0)
    torch.manual_seed(0)
    model = spec.build(ctx, spec.make_hparams({}))
    streams = spec.feeding_for({}).streams(m)
    lead = (streams, 6) if streams > 1 else (6,)
    ids = torch.randint(3, 50, (*lead, 12))
    ids[..., 8:] = 0  # padding
    y = torch.randint(0, 3, lead)
    model.train()
    out = model.training_outputs(ids, y)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), out.targets.flatten())
    loss.backward()
    assert torch.isfinite(loss) and out.logits.shape[-1] == 3
    model.eval()
    with torch.no_grad():
        probs = model(ids[0] if streams > 1 else ids).softmax(-1)
    assert probs.shape == (m, 6, 3)
    assert torch.allclose(probs.sum(-1), torch.ones(m, 6))


def test_padding_does_not_change_the_prediction() -> None:
    from harness.backbones.text import TextTransformer

    torch.manual_seed(0)
    net = TextTransformer(8, 2, vocab_size=20, dim=16, depth=2, heads=2).eval()
    ids = torch.tensor([[2, 5, 6, 7, 0, 0, 0, 0]])
    other = ids.clone()
    other[0, 4:] = 0  # same real tokens, padding positions' embeddings never enter
    with torch.no_grad():
        a = net(ids)
        net.tokens.weight[0] += 1.0  # a different pad embedding: masked out of keys and pooling
        b = net(other)
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("method", ["packed_ensemble", "batch_ensemble"])
def test_packed_and_batch_ensemble_build_the_text_encoder_only(method: str) -> None:
    """They rebuild text_transformer from their own layers; a pre-trained encoder's
    architecture is the library's, so they refuse it (a validate error)."""
    supported = METHODS.get(method).backbones
    assert "text_transformer" in supported and "hf_encoder" not in supported


def test_packed_and_batch_text_members_are_independent() -> None:
    """Changing one member's own parameters changes that member's logits only."""
    from methods._tu.text import batched_text_transformer, packed_text_transformer

    kw = {"dim": 16, "depth": 2, "heads": 2, "vocab_size": 50}
    ctx = BuildContext("text_transformer", (12,), 3, 4, kw, seed=0)
    torch.manual_seed(0)
    packed = packed_text_transformer(ctx, 2.0, 2).eval()
    batched = batched_text_transformer(ctx, split=False).eval()
    ids = torch.randint(3, 50, (5, 12))
    ids[:, 9:] = 0
    c = packed.tokens.weight.shape[1] // 4  # member block width α·D/M
    with torch.no_grad():
        before = packed(ids).view(4, 5, 3)
        packed.tokens.weight[:, c : 2 * c] += torch.randn(50, c)  # member 1's embedding
        after = packed(ids).view(4, 5, 3)
        packed.blocks[0].norm1.weight[3 * c :] += 1.0  # member 3's LayerNorm affine
        last = packed(ids).view(4, 5, 3)
    changed = (before - after).abs().amax(dim=(1, 2))
    assert changed[1] > 1e-3 and changed[[0, 2, 3]].max() == 0
    changed = (after - last).abs().amax(dim=(1, 2))
    assert changed[3] > 1e-3 and changed[:3].max() == 0
    with torch.no_grad():
        before = batched(ids).view(4, 5, 3)
        batched.core_model.head.s_group[2] += 1.0  # member 2's fast weights
        after = batched(ids).view(4, 5, 3)
    changed = (before - after).abs().amax(dim=(1, 2))
    assert changed[2] > 1e-3 and changed[[0, 1, 3]].max() == 0
    with pytest.raises(ValueError, match=r"packed width α·dim = 20 does not split into M=4"):
        packed_text_transformer(ctx, 1.25, 1)


def test_hf_encoder_conversion_by_path_preserves_predictions(tiny_bert: Path) -> None:
    """σN-Ens on a pre-trained encoder: every LayerNorm becomes member-specific and each member
    reproduces the loaded model's logits at step 0."""
    from methods._sigma.norm import SigmaLayerNorm, sigma_norm_layers

    kw = {"model": str(tiny_bert)}
    torch.manual_seed(0)
    single = METHODS.get("single").build(BuildContext("hf_encoder", (8,), 2, 1, kw, seed=0), None)
    torch.manual_seed(0)
    sigma = METHODS.get("sigma_ens")
    ens = sigma.build(BuildContext("hf_encoder", (8,), 2, 3, kw, seed=0), sigma.make_hparams({}))
    layers = sigma_norm_layers(ens)
    # embeddings + 2 per layer × 2 layers
    assert len(layers) == 5 and all(isinstance(mod, SigmaLayerNorm) for _, mod in layers)
    ids = torch.tensor([[2, 5, 6, 7, 3, 0, 0, 0], [2, 8, 9, 3, 0, 0, 0, 0]])
    single.eval()
    ens.eval()
    with torch.no_grad():
        ref, members = single(ids), ens(ids)  # (1, 2, 2), (3, 2, 2)
    assert members.shape == (3, 2, 2)
    assert torch.allclose(members, ref.expand(3, -1, -1), atol=1e-5)
    with pytest.raises(OSError, match=r"hf_encoder: '/nonexistent/bert' is not on this machine"):
        BuildContext("hf_encoder", (8,), 2, 1, {"model": "/nonexistent/bert"}).build_backbone()


# --------------------------------------------------------------------------------------------
# End to end through the CLI


SCRATCH_SUITE = """
name: sst2_tiny
grid:
  datasets: [sst2]
  backbones:
    - name: text_transformer
      kwargs: {dim: 16, depth: 1, heads: 2, vocab_size: 64}
  M: [2]
  seeds: [0]
  methods:
    - single
    - name: sigma_ens
      hparams: {tau: 1.0, lam: 0.01}
    - deep_ensemble
    - name: mc_dropout
      hparams: {dropout_rate: 0.1}
    - name: packed_ensemble
      hparams: {alpha: 2, gamma: 1}
    - batch_ensemble
recipe:
  epochs: 2
  batch_size: 8
  optimizer: adamw
  lr: 0.003
  weight_decay: 0.01
  schedule: cosine
  eval_batch_size: 16
  device: cpu
evaluation:
  corruptions: []
  ood: [20newsgroups, imdb]
  cost: true
  cost_steps: 1
"""

CONVERSION_SUITE = """
name: sst2_tinybert
grid:
  datasets: [sst2_tinybert]
  backbones:
    - name: hf_encoder
      kwargs: {{model: "{model}"}}
  M: [2]
  seeds: [0]
  methods:
    - single
    - name: sigma_ens
      hparams: {{tau: 1.0, lam: 0.01}}
    - name: sigma_ens
      hparams: {{tau: 1.0, lam: 0.01, pretrain_epochs: 1}}
recipe:
  epochs: 1
  batch_size: 8
  optimizer: adamw
  lr: 0.0001
  weight_decay: 0.01
  schedule: constant
  eval_batch_size: 16
  device: cpu
evaluation:
  corruptions: []
  ood: [20newsgroups_tinybert]
"""


def _records(results: Path) -> dict[str, dict]:
    out = {}
    for path in results.glob("*/record.json"):
        rec = json.loads(path.read_text())
        out[rec["config"]["method"] if "config" in rec else rec["method"]] = rec
    return out


@pytest.mark.slow  # a whole text suite through the CLI (~20 s); CI runs it
def test_text_suites_run_end_to_end_through_the_cli(
    tmp_path: Path, data_root: Path, tiny_bert: Path, monkeypatch, capsys
) -> None:
    from harness.cli import main

    scratch = tmp_path / "scratch.yaml"
    scratch.write_text(textwrap.dedent(SCRATCH_SUITE))
    results = tmp_path / "results"
    argv = ["--results", str(results), "--data-root", str(data_root), "-q"]
    assert main(["validate", str(scratch), "--data-root", str(data_root)]) == 0
    corrupted = tmp_path / "corrupted.yaml"
    corrupted.write_text(
        textwrap.dedent(SCRATCH_SUITE).replace("corruptions: []", "corruptions: [all]")
    )
    assert main(["validate", str(corrupted), "--data-root", str(data_root)]) == 2
    assert (
        "dataset 'sst2' has no corruptions (its inputs are not images)" in capsys.readouterr().err
    )
    assert main(["run", str(scratch), "--executor", "inprocess", *argv]) == 0
    recs = _records(results / "sst2_tiny")
    assert set(recs) == {
        "single",
        "sigma_ens",
        "deep_ensemble",
        "mc_dropout",
        "packed_ensemble",
        "batch_ensemble",
    }
    for name, rec in recs.items():
        assert rec["status"] == "done", (name, rec.get("error"))
        clean = rec["metrics"]["clean"]
        assert 0.0 <= clean["acc"] <= 1.0 and clean["nll"] > 0
        assert set(rec["metrics"]["ood"]) == {"20newsgroups", "imdb"}
        assert 0.0 <= rec["metrics"]["ood"]["imdb"]["msp"]["auroc"] <= 1.0
        assert rec["cost"]["flops_per_image"] > 0 and rec["cost"]["train_images_per_s"] > 0
    # parameters: the suite's tiny encoder alone, and each method's own count on top of it
    single = recs["single"]["cost"]["params_total"]
    assert recs["deep_ensemble"]["cost"]["params_total"] == 2 * single
    assert single < recs["sigma_ens"]["cost"]["params_total"] < 1.1 * single
    assert len(recs["sigma_ens"]["history"]) == 2
    # 32 training sentences of 8 patterns, dev = the same patterns + "!": learnt in 2 epochs
    # (measured: accuracy 1.0 for every method; chance is 0.5)
    assert recs["single"]["metrics"]["clean"]["acc"] >= 0.75

    # The pre-trained encoder by path: its tokeniser is registered by a plugin module.
    plugin = tmp_path / "tinybert_text_plugin.py"
    plugin.write_text(
        "from harness.data.sst2 import register_text_datasets\n"
        f"register_text_datasets('_tinybert', 'hf:{tiny_bert}')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    conversion = tmp_path / "conversion.yaml"
    conversion.write_text(textwrap.dedent(CONVERSION_SUITE.format(model=tiny_bert)))
    code = main(["run", str(conversion), "--executor", "inprocess", "--plugin", plugin.stem, *argv])
    assert code == 0
    recs = [json.loads(p.read_text()) for p in (results / "sst2_tinybert").glob("*/record.json")]
    labels = sorted(r["label"] for r in recs)
    assert labels == [  # σN-Ens of the pre-trained encoder, and of the suite's fine-tuned single
        "sst2_tinybert/hf_encoder/sigma_ens(M=2,lam=0.01)/seed0",
        "sst2_tinybert/hf_encoder/sigma_ens(M=2,lam=0.01,pretrain_epochs=1)/seed0",
        "sst2_tinybert/hf_encoder/single(M=1)/seed0",
    ]
    for rec in recs:
        name = rec["label"]
        assert rec["status"] == "done", (name, rec.get("error"))
        assert rec["metrics"]["clean"]["nll"] > 0
        assert set(rec["metrics"]["ood"]) == {"20newsgroups_tinybert"}


def test_register_text_datasets_names_every_set() -> None:
    assert {"sst2", "20newsgroups", "imdb", "sst2_bert", "imdb_bert"} <= set(DATASETS.names())
    with pytest.raises(Exception, match=r"dataset 'sst2' is already registered"):
        register_text_datasets("", "word")


# --------------------------------------------------------------------------------------------
# harness data download (published archives served from 127.0.0.1 through the mirror variable)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path):
    """(served folder, base URL) of a local HTTP server, for this test only."""
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served))
    )
    httpd.handle_error = lambda request, client_address: None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_published_text_archives_stay_in_the_code() -> None:
    from harness.data._machinery import download as dl

    assert dl.ARCHIVES["sst2"].url == "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"
    assert dl.ARCHIVES["sst2"].md5 == "9f81648d4199384278b86e315dac217c"
    assert dl.ARCHIVES["imdb"].filename == "aclImdb_v1.tar.gz"
    assert dl.ARCHIVES["20newsgroups"].md5 == "d6e9e45cb8cb77ec5276dfa6dfc14318"


def test_data_download_fetches_and_extracts_the_text_sets(
    tmp_path: Path, mirror, monkeypatch, capsys
) -> None:
    from harness.cli import main
    from harness.data._machinery import download as dl

    served, base = mirror
    staging = tmp_path / "staging"
    write_sst2(staging)
    write_ood(staging)
    with zipfile.ZipFile(served / "SST-2.zip", "w") as z:  # GLUE's zip: a top folder SST-2/
        for path in sorted((staging / "SST-2").rglob("*")):
            z.write(path, path.relative_to(staging).as_posix())
    with tarfile.open(served / "aclImdb_v1.tar.gz", "w:gz") as tar:
        tar.add(staging / "aclImdb", arcname="aclImdb")
    with tarfile.open(served / "20news-bydate.tar.gz", "w:gz") as tar:
        tar.add(staging / "20news-bydate-test", arcname="20news-bydate-test")
    for name, file in (
        ("sst2", "SST-2.zip"),
        ("imdb", "aclImdb_v1.tar.gz"),
        ("20newsgroups", "20news-bydate.tar.gz"),
    ):
        md5 = hashlib.md5((served / file).read_bytes()).hexdigest()
        monkeypatch.setitem(dl.ARCHIVES, name, dl.Archive(dl.ARCHIVES[name].url, md5))
    monkeypatch.setenv(dl.MIRROR_ENV, base)
    root = tmp_path / "data"
    assert main(["data", "download", "sst2", "imdb", "20newsgroups", "--data-root", str(root)]) == 0
    assert "sst2: ready in" in capsys.readouterr().out
    for name in ("sst2", "imdb", "20newsgroups"):
        DATASETS.get(name).require(root)  # raises DataMissingError if a file is not in place
    assert not list(root.glob("*.zip")) and not list(root.glob("*.tar.gz"))  # archives removed
    texts, labels = read_glue_tsv(root / "SST-2" / "train.tsv")
    assert len(texts) == 32 and labels.sum().item() == 16
