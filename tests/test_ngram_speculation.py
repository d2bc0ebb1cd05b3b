"""n-gram speculation end to end on the real llama.cpp engine: the draft-length flag each
n-gram type takes reaches the server, and the counters show what it drafted."""

from __future__ import annotations

import json
import urllib.request

import pytest

from conftest import REPO, free_port, load_yaml
from gridbench.config.loading import load_grid
from gridbench.engines import probe
from gridbench.engines.manager import SlotManager
from gridbench.engines.spec_metrics import acceptance, parse_spec_counters

pytestmark = pytest.mark.integration


def complete(base_url: str, model: str) -> None:
    body = {"model": model, "prompt": "the history of the land", "max_tokens": 96, "temperature": 0}
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.load(response)["usage"]["completion_tokens"] == 96


def counters(base_url: str):
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        return parse_spec_counters(response.read().decode())


@pytest.mark.parametrize(
    ("method", "extra_args", "drafts"),
    [
        # the generated models loop with a short period at temperature 0: ngram-mod follows
        # the loop, ngram-simple's 12-token lookup needs a longer one and never drafts
        ("ngram-mod", ["--spec-ngram-mod-n-min", "4", "--spec-ngram-mod-n-match", "16"], True),
        ("ngram-simple", [], False),
    ],
)
def test_ngram_types_draft_with_their_own_length(workdir, method, extra_args, drafts):
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    config["speculations"]["ngram"] = {
        "method": method,
        "num_speculative_tokens": 8,
        "extra_args": extra_args,
    }
    config["configs"]["D_f16_ngram"] = {"engine": "llamacpp", "checkpoint": "f16", "speculation": "ngram"}
    manager = SlotManager(["cpu"])
    with manager.lease(load_grid(config, "mechanism.yaml").configs["D_f16_ngram"]) as engine:
        assert probe.http_get(engine.base_url + "/health")[0] == 200
        before = counters(engine.base_url)
        complete(engine.base_url, "demo-f16")
        after = counters(engine.base_url)
    manager.stop_all()
    result = acceptance(before, after, "test")
    if drafts:
        assert result.delta_drafts > 0
        assert result.delta_draft_tokens <= 8 * result.delta_drafts  # the length flag took
        assert result.acceptance_rate == pytest.approx(1.0)
    else:
        assert result.delta_drafts == 0
