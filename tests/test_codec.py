"""gridbench.util.codec writes a record as its fields, in order, and reads it back whole; its two
markers leave out a key at its default and put a nested record's keys among its parent's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gridbench.util import codec


@dataclass(frozen=True)
class Image:
    image: str | None
    image_id: str | None
    command: tuple[str, ...] | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class Engine:
    kind: str
    image: Image = field(metadata=codec.INLINE)
    log_path: Path = Path("/tmp/engine.log")
    argv: tuple[str, ...] = ()
    traceback: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


def test_a_record_is_written_as_its_fields_in_order_with_inline_keys_in_place():
    record = Engine("vllm", Image("vllm/vllm-openai", "sha256:1", ("vllm", "serve")), argv=("--port", "8000"))
    document = codec.to_json(record)
    assert json.dumps(document) == json.dumps(
        {
            "kind": "vllm",
            "image": "vllm/vllm-openai",
            "image_id": "sha256:1",
            "command": ["vllm", "serve"],
            "log_path": "/tmp/engine.log",
            "argv": ["--port", "8000"],
        }
    )
    assert codec.from_json(Engine, document) == record


def test_a_key_at_its_default_is_left_out_and_read_back_as_the_default():
    record = Engine("llamacpp", Image(None, None))
    document = codec.to_json(record)
    assert "command" not in document and "traceback" not in document
    assert codec.from_json(Engine, document) == record
    failed = Engine("llamacpp", Image(None, None), traceback="Traceback ...")
    assert codec.to_json(failed)["traceback"] == "Traceback ..."
    assert codec.from_json(Engine, codec.to_json(failed)) == failed


def test_keys_a_record_does_not_name_are_ignored_when_read():
    document = {"kind": "vllm", "image": None, "image_id": None, "added_later": 1}
    assert codec.from_json(Engine, document) == Engine("vllm", Image(None, None))


@dataclass(frozen=True)
class Spread:
    mean: float | None
    p50: float | None


@dataclass(frozen=True)
class Summary:
    requests: int
    ttft_ms: Spread = field(metadata=codec.INLINE_PREFIXED)
    wall_s: float = 0.0


def test_a_prefixed_inline_record_names_its_keys_after_its_field():
    record = Summary(4, Spread(12.5, None), wall_s=2.0)
    document = codec.to_json(record)
    assert list(document.items()) == [
        ("requests", 4),
        ("ttft_ms_mean", 12.5),
        ("ttft_ms_p50", None),
        ("wall_s", 2.0),
    ]
    assert codec.from_json(Summary, document) == record


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float | None = None


def test_a_whole_number_reads_back_as_written():
    # a config's `temperature: 0` is sent and recorded as 0, as it was before the codec
    assert json.dumps(codec.to_json(codec.from_json(Sampling, {"temperature": 0, "top_p": 1}))) == (
        '{"temperature": 0, "top_p": 1}'
    )
    assert codec.from_json(Sampling, {"temperature": "0.5"}) == Sampling(0.5)
