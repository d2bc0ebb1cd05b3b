"""scripts/run_gpu_study.sh fails, after packing what it has, when a step failed or when no cell
was measured, and says which on its last line. Run on this machine in a copy of the tree whose
models script writes nothing (the real one writes 6 GB). nvidia-smi fails: the informational
`machine` step must not count that."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake.cli import get_argument_parser

from conftest import REPO
from gridbench import layout
from gridbench.config.loading import load_grid_files
from gridbench.drafts.carry import export_draft
from gridbench.drafts.recipe import read_recipe, write_recipe_files
from synthetic import trained_draft

# what a developer may have set for a real run
DRAFT = "smollm2_eagle3_ci"
REAL_RUN_SETTINGS = ("RESULTS_FROM", "WHILE_BUILDING", "STUDY_CONFIG", "STUDY", "BUDGET_S")
FAKE_SNAKEMAKE = """#!/usr/bin/env bash
# a sweep that leaves a dataset of one cell with status $CELL_STATUS, and the deadline it got
[ "${1:-}" = --version ] && echo 9.27.1 && exit 0
echo "$(date +%s) ${GRIDBENCH_DEADLINE:-}" > sweep-deadline
mkdir -p dataset
printf 'config,context_tokens,status\\nF16_none,512,%s\\n' "$CELL_STATUS" > dataset/dataset.csv
"""
FAKE_LLAMA_SERVER = """#!/usr/bin/env bash
echo "Available devices:"
echo "  CUDA0: NVIDIA H200 (143000 MiB, 142000 MiB free)"
"""


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def tree(tmp_path) -> Path:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts/run_gpu_study.sh", tree / "scripts")
    executable(tree / "scripts/prepare_gpu_models.sh", "#!/usr/bin/env bash\necho no models here\n")
    (tree / "src").symlink_to(REPO / "src")
    return tree


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """Commands found before the real ones: an nvidia-smi without a GPU to see."""
    fake_bin = tmp_path / "fake-bin"
    executable(fake_bin / "nvidia-smi", "#!/usr/bin/env bash\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    return fake_bin


def run_study(
    tree: Path, fake_bin: Path, tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    (tmp_path / "carry").mkdir(parents=True, exist_ok=True)  # no wheels, no llama.cpp sources
    study_env = {
        **{name: value for name, value in os.environ.items() if name not in REAL_RUN_SETTINGS},
        "OUT": str(out),
        "CARRY": str(tmp_path / "carry"),
        "CARRY_STASH": str(tmp_path / "stash"),
        "GRIDBENCH_SITE": str(tmp_path / "site"),
        # python3 is this venv's: it has what the carried wheels would bring
        "PATH": os.pathsep.join([str(fake_bin), str(Path(sys.executable).parent), os.environ["PATH"]]),
        **env,
    }
    result = subprocess.run(
        ["bash", tree / "scripts/run_gpu_study.sh", *args],
        capture_output=True,
        text=True,
        env=study_env,
        timeout=120,
    )
    return result, out


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stdout.strip().splitlines()[-1]


def test_a_failed_step_fails_the_run_after_packing(tree, fake_bin, tmp_path):
    result, out = run_study(tree, fake_bin, tmp_path)
    assert "NVIDIA-SMI has failed" in result.stdout  # and `machine` is not among the failed steps
    assert "no llama.cpp build runs here" in result.stdout
    assert result.returncode != 0
    assert last_line(result).startswith("FAILED in ")
    assert last_line(result).endswith(
        ": failed steps: llama_cpp; no cell measured (no ok row in dataset/dataset.csv)"
    )
    assert (out / "study.tar.gz").stat().st_size > 0
    assert (out / "run.log").read_text().strip().splitlines()[-1] == last_line(result)


@pytest.mark.parametrize(("cell_status", "returncode", "verdict"), [
    ("failed", 1, r"FAILED in \d+ s: no cell measured \(no ok row in dataset/dataset.csv\)"),
    ("ok", 0, r"done in \d+ s: 1 cells ok"),
])  # fmt: skip
def test_a_run_without_an_ok_cell_fails(tree, fake_bin, tmp_path, cell_status, returncode, verdict):
    executable(fake_bin / "snakemake", FAKE_SNAKEMAKE)
    # a carried llama.cpp build that sees the GPU: the sweep runs
    executable(tree / "resources/llamacpp-cuda/bin/llama-server", FAKE_LLAMA_SERVER)
    (tree / "resources/llamacpp-cuda/bin/.carried").write_text("carried\n")
    result, out = run_study(tree, fake_bin, tmp_path, CELL_STATUS=cell_status)
    assert "== sweep: " in result.stdout and "failed steps" not in result.stdout
    assert result.returncode == returncode, result.stdout[-3000:]
    assert re.fullmatch(verdict, last_line(result)), last_line(result)
    assert (out / "dataset.csv").exists()


def test_the_sweep_gets_the_deadline_its_budget_sets(tree, fake_bin, tmp_path):
    """Engine starts that would not be ready by the end of the sweep's time are not begun
    (gridbench.engines.deadline): the sweep is told when that is."""
    executable(fake_bin / "snakemake", FAKE_SNAKEMAKE)
    executable(tree / "resources/llamacpp-cuda/bin/llama-server", FAKE_LLAMA_SERVER)
    (tree / "resources/llamacpp-cuda/bin/.carried").write_text("carried\n")
    result, _ = run_study(tree, fake_bin, tmp_path, CELL_STATUS="ok", BUDGET_S="300", PACK_S="40")
    assert result.returncode == 0, result.stdout[-3000:]
    now, deadline = map(int, (tree / "sweep-deadline").read_text().split())
    assert 200 <= deadline - now <= 260  # 300 s less packing, less the steps before the sweep


FAILED_SWEEP = """#!/usr/bin/env bash
# a sweep stopped by the loan's budget: its onerror handler left the dataset of what it
# measured in partial/, its grid in .gridbench/
[ "${1:-}" = --version ] && echo 9.27.1 && exit 0
echo sweep >> sweeps.log
mkdir -p .gridbench partial/dataset
cp "$GRID" .gridbench/grid-0.json
printf 'config,context_tokens,status\\nF16_none,512,ok\\nF16_none,4096,failed\\n' \\
    > partial/dataset/dataset.csv
echo '# partial' > partial/dataset/comparison.md
exit 1
"""


def test_a_stopped_sweep_leaves_the_workflow_outputs_alone_so_the_next_run_measures_on(
    tree, fake_bin, tmp_path
):
    """On a machine kept warm between two runs, the second must still sweep: the first may not
    write the workflow's own dataset/ (Snakemake would find it and measure nothing more)."""
    executable(fake_bin / "snakemake", FAILED_SWEEP)
    executable(tree / "resources/llamacpp-cuda/bin/llama-server", FAKE_LLAMA_SERVER)
    (tree / "resources/llamacpp-cuda/bin/.carried").write_text("carried\n")
    grid = REPO / "tests/fixtures/demo_run/grid.json"
    result, out = run_study(tree, fake_bin, tmp_path, GRID=str(grid))
    assert not (tree / "dataset").exists(), "finish wrote the workflow's outputs"
    assert result.returncode == 1
    assert re.fullmatch(r"FAILED in \d+ s: failed steps: sweep", last_line(result)), last_line(result)
    assert "F16_none" in (out / "dataset.csv").read_text()  # packed from partial/
    assert (out / "comparison.md").read_text() == "# partial\n"


def test_compile_caches_go_back_with_the_study_and_a_later_run_unpacks_them(tree, fake_bin, tmp_path):
    """A loan's vLLM compile caches come back in $OUT (engine-cache.tar.gz) and, carried to the
    next loan, are unpacked before any engine starts; what that machine holds itself is kept."""
    executable(fake_bin / "snakemake", FAKE_SNAKEMAKE)
    executable(tree / "resources/llamacpp-cuda/bin/llama-server", FAKE_LLAMA_SERVER)
    (tree / "resources/llamacpp-cuda/bin/.carried").write_text("carried\n")
    graph = tree / "resources/engine-cache/vllm/0f7a314b26a4b1fe/torch_compile_cache/graph.py"
    graph.parent.mkdir(parents=True)
    graph.write_text("# compiled on the first loan\n")
    result, out = run_study(tree, fake_bin, tmp_path / "loan-1", CELL_STATUS="ok")
    assert result.returncode == 0, result.stdout[-3000:]
    assert (out / "engine-cache.tar.gz").exists()

    next_loan = tmp_path / "loan-2"
    shutil.rmtree(tree / "resources/engine-cache")
    own = tree / "resources/engine-cache/vllm/0f7a314b26a4b1fe/torch_compile_cache/own.py"
    own.parent.mkdir(parents=True)
    own.write_text("# this machine's\n")
    (next_loan / "carry").mkdir(parents=True)
    shutil.copy(out / "engine-cache.tar.gz", next_loan / "carry")
    result, _ = run_study(tree, fake_bin, next_loan, CELL_STATUS="ok")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "compile caches carried: 1 in resources/engine-cache" in result.stdout
    assert graph.read_text() == "# compiled on the first loan\n"
    assert own.read_text() == "# this machine's\n"


def test_compile_caches_that_do_not_fit_what_comes_back_are_left_behind_and_said_so(tree, fake_bin, tmp_path):
    executable(fake_bin / "snakemake", FAKE_SNAKEMAKE)
    executable(tree / "resources/llamacpp-cuda/bin/llama-server", FAKE_LLAMA_SERVER)
    (tree / "resources/llamacpp-cuda/bin/.carried").write_text("carried\n")
    kernel = tree / "resources/engine-cache/vllm/key/torch_compile_cache/kernel.cubin"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(os.urandom(3 * 1048576))  # incompressible: 3 MiB
    result, out = run_study(tree, fake_bin, tmp_path, CELL_STATUS="ok", OUT_MIB="2")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "the compile caches do not fit what comes back" in result.stdout
    assert not list(out.glob("engine-cache.tar.gz*"))


def test_the_capacity_search_runs_after_the_sweep_on_the_study_files_and_the_sweep_renders_its_probes(
    tree, fake_bin, tmp_path
):
    """CAPACITY_SEARCH=1: gridbench load-search over the study's config files and the run's
    arguments (here reading the H100 study's load cells, no probe allowed), then a second sweep."""
    executable(fake_bin / "snakemake", FAKE_SNAKEMAKE + "echo sweep >> sweeps.log\n")
    executable(tree / "resources/llamacpp-cuda/bin/llama-server", FAKE_LLAMA_SERVER)
    (tree / "resources/llamacpp-cuda/bin/.carried").write_text("carried\n")
    shutil.copytree(REPO / "studies/h100-real/results/load", tree / "results/load")
    no_probe = tmp_path / "no-probe.yaml"
    no_probe.write_text("load:\n  search:\n    max_probes: 0\n")
    study = [REPO / "config/studies" / name for name in ("h200-real.yaml", "h200-real-quality-load.yaml")]
    result, _ = run_study(
        tree, fake_bin, tmp_path, "--config", "config=L_q4_1_none",
        STUDY_CONFIG=" ".join(map(str, [*study, no_probe])), CELL_STATUS="ok", CAPACITY_SEARCH="1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert (
        "capacity search: L_q4_1_none code poisson: meets the SLO at 16 req/s, misses it at 64 req/s"
        " after 0 added rates" in result.stdout
    )
    assert "R_bf16_none" not in (tree / "dataset/load.csv").read_text()  # the run's --config
    assert (tree / "sweeps.log").read_text() == "sweep\nsweep\n"


def test_a_study_without_a_llama_cpp_engine_builds_none(tree, fake_bin, tmp_path):
    """config/studies/h100-speculation.yaml serves vLLM only: no llama.cpp sources needed, the
    step passes, and the run fails only for the sweep's missing cells."""
    (tree / "config/studies").mkdir(parents=True)
    shutil.copy(REPO / "config/studies/h100-speculation.yaml", tree / "config/studies")
    result, _ = run_study(tree, fake_bin, tmp_path, STUDY="h100-speculation", CELL_STATUS="failed")
    assert "no llama.cpp engine in the study: none built" in result.stdout
    assert "no llama.cpp build runs here" not in result.stdout
    assert "llama_cpp" not in last_line(result), last_line(result)


def test_a_carried_draft_is_imported_after_its_target_is_built_and_before_the_sweep(tree, fake_bin, tmp_path):
    """A draft an earlier loan exported, in the carry folder as split's pieces: the workflow
    builds its target (Snakemake given the target's files), then the draft is unpacked where
    the sweep finds it trained."""
    calls = tmp_path / "snakemake-calls"
    executable(fake_bin / "snakemake", FAKE_SNAKEMAKE.replace("mkdir -p", f'echo "$*" >> {calls}\nmkdir -p'))
    (tree / "config/studies").mkdir(parents=True)
    shutil.copy(REPO / "config/studies/h100-speculation.yaml", tree / "config/studies")
    loan = tmp_path / "loan"
    (loan / "carry").mkdir(parents=True)
    cwd = Path.cwd()
    os.chdir(tree)
    try:
        write_recipe_files(load_grid_files([REPO / "config/ci-drafts.yaml"]))
        targets = load_grid_files([REPO / "config/ci-drafts.yaml"]).drafts[DRAFT].files
        for name in targets:
            Path(name).parent.mkdir(parents=True, exist_ok=True)
            Path(name).write_text(name)
        paths = trained_draft(DRAFT)
        export_draft(read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=DRAFT))), tmp_path / "d.tar.gz")
        shutil.rmtree(paths.folder)
    finally:
        os.chdir(cwd)
    data = (tmp_path / "d.tar.gz").read_bytes()
    half = len(data) // 2
    (loan / f"carry/draft-{DRAFT}.tar.gz.part-00").write_bytes(data[:half])
    (loan / f"carry/draft-{DRAFT}.tar.gz.part-01").write_bytes(data[half:])

    result, _ = run_study(tree, fake_bin, loan, STUDY="h100-speculation", CELL_STATUS="ok")
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"draft {DRAFT}: 13 files carried in" in result.stdout
    assert (tree / paths.head / "model.safetensors").exists()
    build, sweep = calls.read_text().splitlines()
    # Snakemake's own parser: --quiet and --configfile take every word after them
    parsed = get_argument_parser().parse_args(build.split())
    assert [str(t) for t in parsed.targets] == list(targets) and parsed.configfile, build
    assert sweep.startswith("-j1 --scheduler")
