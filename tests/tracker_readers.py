"""Read what the trackers wrote with the trackers' own formats (plain module, not a test file).

- W&B offline runs: wandb ≥ 0.30 writes only the run's transaction log ``run-<id>.wandb`` (no
  ``config.yaml`` or ``wandb-summary.json`` until ``wandb sync``) and ships no Python reader for
  it; :func:`wandb_run` reads the log's framing (LevelDB's log format behind a ``:W&B`` header)
  and decodes each entry with wandb's own protobuf schema, ``wandb.proto.wandb_internal_pb2.Record``
  — the records ``wandb sync`` uploads.
- TensorBoard: :func:`tensorboard_hparams` reads the HParams plugin's summaries with
  TensorBoard's ``EventAccumulator`` and parses them with the plugin's own ``metadata`` module.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768  # LevelDB log block size
_HEADER = 7  # crc32 (4), length (2), type (1)


def _entries(data: bytes) -> list[bytes]:
    """The payloads of a LevelDB-format log after wandb's 7-byte ``:W&B`` file header."""
    assert data[:4] == b":W&B", data[:8]
    out, pending, pos = [], b"", 7
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        pos += _HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == 1:  # FULL
            out.append(chunk)
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            out.append(pending + chunk)
    return out


@dataclass
class WandbRun:
    """What one offline run folder holds: the run record's fields, its config, summary, and
    history rows (by step)."""

    run_id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def wandb_run(run_dir: Path) -> WandbRun:
    """Decode ``<run_dir>/run-*.wandb`` (one ``offline-run-*`` folder) with wandb's schema."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("run-*.wandb")
    run = WandbRun()
    for raw in _entries(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.run_id, run.name, run.group = r.run_id, r.display_name, r.run_group
            run.job_type, run.tags = r.job_type, list(r.tags)
            for item in r.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in rec.summary.update:
                key = item.key or "/".join(item.nested_key)
                run.summary[key] = json.loads(item.value_json)
        elif kind == "history":
            items = rec.history.item
            run.history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                for i in items})  # fmt: skip
    return run


@dataclass
class TensorBoardSession:
    """The HParams session of one TensorBoard run folder and its scalars' last values."""

    hparams: dict[str, Any]
    group_name: str
    end_status: str | None
    scalars: dict[str, float]
    scalar_steps: dict[str, list[int]]


def tensorboard_hparams(logdir: Path) -> TensorBoardSession:
    """Read ``logdir``'s events with TensorBoard's ``EventAccumulator``: the HParams plugin's
    session start/end summaries and every scalar's last value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    end_status = None
    if metadata.SESSION_END_INFO_TAG in content:
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
        end_status = api_pb2.Status.Name(end.status)
    scalars, steps = {}, {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        scalars[tag] = events[-1].value
        steps[tag] = [e.step for e in events]
    return TensorBoardSession(hparams, start.group_name, end_status, scalars, steps)
