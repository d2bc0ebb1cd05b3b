"""The workflow end to end on the real CPU engine: cells, warm reuse, dataset, reruns."""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pandas as pd
import pytest
import yaml

from conftest import REPO, free_port, snakemake_argv, sweep_logs, write_config
from conftest import snakemake as run_snakemake
from gridbench.cells.kinds import CELL_KINDS
from gridbench.engines.runtime import ProcessRuntime, RuntimeHandle
from gridbench.util import codec

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str, background: bool = False):
    if not background:
        return run_snakemake(workdir, "-j1", *args)
    return subprocess.Popen(
        snakemake_argv(workdir, "-j1", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def events(workdir: Path) -> list[dict]:
    path = workdir / "logs/engines/events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def jobs_of_last_run(workdir: Path, rule: str) -> list[dict[str, str]]:
    """The wildcards of every job of ``rule`` (a checkpoint too) in Snakemake's own log of its
    latest run."""
    log = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text()
    jobs = []
    for match in re.finditer(rf"^(?:local)?(?:rule|checkpoint) {rule}:\n((?:    .*\n)+)", log, re.MULTILINE):
        wildcards = re.search(r"^    wildcards: (.*)$", match.group(1), re.MULTILINE).group(1)
        jobs.append(dict(pair.split("=", 1) for pair in wildcards.split(", ")))
    return jobs


def test_small_grid_end_to_end(workdir, demo_config):
    demo_config["configs"] = {k: demo_config["configs"][k] for k in ("D_f16_n0", "D_f16_draft4")}
    demo_config["depths"] = [0, 256]
    write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    starts = [e["config"] for e in events(workdir) if e["event"] == "start"]
    assert starts == ["D_f16_n0", "D_f16_draft4"]  # one warm engine per config
    assert [e["event"] for e in events(workdir)][-1] == "stop"  # none left running

    frame = pd.read_parquet(workdir / "dataset/dataset.parquet")
    assert list(frame["config"]) == ["D_f16_n0", "D_f16_n0", "D_f16_draft4", "D_f16_draft4"]
    assert (frame["status"] == "ok").all() and (frame["decode_tps"] > 0).all()
    draft = frame[frame["config"] == "D_f16_draft4"]
    assert (draft["acceptance_rate"] > 0.8).all()  # the draft shares the target's output matrix
    assert frame[frame["config"] == "D_f16_n0"]["acceptance_rate"].isna().all()

    document = json.loads((workdir / "dataset/dataset.json").read_text())
    assert document["D_f16_n0"]["version"] == "0.4.0"
    assert "NaN" not in (workdir / "dataset/dataset.json").read_text()
    raw = json.loads((workdir / "results/raw/D_f16_n0/depth_256.json").read_text())
    assert raw["benchmarks"][0]["context_size"] == 256
    prov = json.loads((workdir / "results/raw/D_f16_n0/depth_256.provenance.json").read_text())
    assert prov["engine"]["serve_argv"][:3] == ["python3", "-m", "gridbench.testengines.xllamacpp_server"]
    assert prov["versions"] == {
        "gridbench": prov["versions"]["gridbench"],
        "load_generator": "llama-benchy",
        "load_generator_version": "0.4.0",
    }
    assert "--depth" in prov["bench"]["argv"] and prov["fingerprint"]


def test_the_prefix_cache_pass_measures_cached_context_beside_cold_with_a_real_cache_hit(
    workdir, demo_config
):
    """Its own cells, raw files, failure records and engine (llama.cpp's prompt cache on; the
    cold cells keep theirs off); a failed cached cell is shown failed and reruns alone; the
    dataset columns come from its raw file."""
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = [0, 1024]
    demo_config.pop("natural")
    demo_config["benchy"]["prefix_cache_pass"] = ["D_q8_0_n0"]
    write_config(workdir / "grid.yaml", demo_config)
    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    wait_for_measuring(proc, workdir / "logs/cells/D_q8_0_n0/depth_1024.pc.log")
    kill_engine(slot_state()["handle"])  # the cached cell's engine dies mid-cell
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, output
    failure = json.loads((workdir / "results/failures/D_q8_0_n0/depth_1024.pc.json").read_text())
    assert failure["prefix_cache"] is True and failure["cell"] == "cell D_q8_0_n0 depth 1024 (cached context)"
    partial = pd.read_csv(workdir / "partial/dataset/dataset.csv").set_index("context_tokens")
    assert list(partial["status"]) == ["ok", "ok"]  # the cold cells stand
    assert partial.loc[1024, "cached_status"] == "failed" and "died" in partial.loc[1024, "cached_reason"]
    assert pd.isna(partial.loc[1024, "ttft_ms_cached"])

    rerun = snakemake(workdir, "--configfile", "grid.yaml")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert jobs_of_last_run(workdir, "bench_cached_cell") == [{"config": "D_q8_0_n0", "depth": "1024"}]
    assert jobs_of_last_run(workdir, "bench_cell") == []
    assert not (workdir / "results/failures/D_q8_0_n0/depth_1024.pc.json").exists()

    raw = json.loads((workdir / "results/raw/D_q8_0_n0/depth_1024.pc.json").read_text())
    assert raw["prefix_caching_enabled"] is True
    assert [b["is_context_prefill_phase"] for b in raw["benchmarks"]] == [True, False]
    assert not (workdir / "results/raw/D_q8_0_n0/depth_0.pc.json").exists()  # no context to cache
    cold = json.loads((workdir / "results/raw/D_q8_0_n0/depth_1024.provenance.json").read_text())
    cached = json.loads((workdir / "results/raw/D_q8_0_n0/depth_1024.pc.provenance.json").read_text())
    assert "--no-cache-prompt" in cold["engine"]["serve_argv"]
    assert "--no-cache-prompt" not in cached["engine"]["serve_argv"]
    assert "--enable-prefix-caching" in cached["bench"]["argv"]
    assert "--enable-prefix-caching" not in cold["bench"]["argv"]
    starts = [e["fingerprint"] for e in events(workdir) if e["event"] == "start"]
    # the cold engine, then the cached one once the cold cells are done; again for the rerun
    assert starts == [cold["fingerprint"], cached["fingerprint"], cached["fingerprint"]]
    assert cached["fingerprint"] != cold["fingerprint"]

    frame = pd.read_parquet(workdir / "dataset/dataset.parquet").set_index("context_tokens")
    assert pd.isna(frame.loc[0, "cached_status"])
    row = frame.loc[1024]
    assert row["status"] == "ok" and row["cached_status"] == "ok"
    # a real hit: the cached request prefills the prompt alone, the cold one the 1024-token context too
    assert row["ttft_ms_cached"] < row["ttft_ms"] and row["ttft_cached_speedup"] > 1
    assert row["ttft_cached_speedup"] == pytest.approx(row["ttft_ms"] / row["ttft_ms_cached"])
    assert row["cached_raw_path"] == "results/raw/D_q8_0_n0/depth_1024.pc.json"
    assert (workdir / "graphs/ttft_cached_vs_context.png").stat().st_size > 10_000
    report = (workdir / "dataset/comparison.md").read_text()
    assert "## Prefix cache: TTFT cold vs cached context" in report
    assert "| depth | cold TTFT (ms) | cached TTFT (ms) | speedup |" in report


def test_the_prefix_cache_pass_schedules_its_cells_after_each_configs_other_cells(
    tmp_path, demo_config, monkeypatch
):
    """A cell per depth above 0 of the named configs, none for the others, and each config's
    cached cells after all its cold and natural ones: its engine switches once."""
    monkeypatch.chdir(tmp_path)
    demo_config["benchy"]["prefix_cache_pass"] = ["D_f16_n0", "D_q8_0_draft4"]
    write_config(tmp_path / "grid.yaml", demo_config)
    result = snakemake(tmp_path, "-n", "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = []
    for rule, block in re.findall(
        r"^(?:local)?rule (\w+):\n(.*?)(?=^\S|\Z)", result.stdout, re.MULTILINE | re.DOTALL
    ):
        config = re.search(r"wildcards: config=(\w+)", block)
        if config and rule.endswith("cell"):
            jobs.append((rule, config.group(1), int(re.search(r"priority: (-?\d+)", block).group(1))))
    cached = [(config, priority) for rule, config, priority in jobs if rule == "bench_cached_cell"]
    assert sorted(config for config, _ in cached) == ["D_f16_n0"] * 3 + ["D_q8_0_draft4"] * 3
    by_config = list(demo_config["configs"])
    for config in ("D_f16_n0", "D_q8_0_draft4"):
        own = [p for rule, c, p in jobs if c == config and rule != "bench_cached_cell"]
        later = [p for _, c, p in jobs if by_config.index(c) > by_config.index(config)]
        mine = [p for c, p in cached if c == config]
        assert min(own) > max(mine) and min(mine) > max(later, default=-(10**9))


RUNTIMES = ["process", pytest.param("docker", marks=pytest.mark.docker)]


def in_runtime(config: dict, runtime: str) -> dict:
    """The demo config, its engine moved into the CPU container when asked."""
    if runtime == "docker":
        overlay = yaml.safe_load((REPO / "config/mechanism-docker.yaml").read_text())
        config["engines"]["llamacpp"].update(overlay["engines"]["llamacpp"])
        for name, change in overlay["checkpoints"].items():
            config["checkpoints"][name].update(change)
    return config


def wait_for_measuring(proc, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while "llama-benchy (0.4.0)" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)


def slot_state() -> dict:
    return json.loads(next(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json")).read_text())


def kill_engine(handle: dict) -> None:
    if handle["runtime"] == "docker":
        docker.from_env().containers.get(handle["container_id"]).kill()
    else:
        os.killpg(handle["pid"], signal.SIGKILL)


def engine_alive(handle: dict) -> bool:
    if handle["runtime"] == "docker":
        try:
            docker.from_env().containers.get(handle["container_id"])
        except docker.errors.NotFound:
            return False
        return True
    # a killed engine may linger as a zombie
    return ProcessRuntime().is_running(codec.from_json(RuntimeHandle, handle))


def test_an_engine_is_checked_once_everything_its_cells_read_is_there(tmp_path, demo_config, monkeypatch):
    """The check of an engine depends on every file its cells read: then all of its cells
    become ready together and run back to back by priority. Without that, the scheduler
    may run the natural cells before the corpus exists, and start each engine twice."""
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "grid.yaml", demo_config)
    result = snakemake(
        tmp_path, "results/preflight/llamacpp.json", "-n", "--quiet", "rules", "--configfile", "grid.yaml"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = dict(re.findall(r"^(\w+) +(\d+)$", result.stdout, re.MULTILINE))
    assert jobs == {"make_demo_models": "1", "make_corpus": "1", "check_engine": "1", "total": "3"}


def test_every_engine_is_checked_before_any_cell_runs(tmp_path, demo_config, monkeypatch):
    """With the greedy scheduler a ready job of higher priority always goes first: an engine
    check below the cells' priorities waited until every cell of the other engines had run
    (seen on the H200: a sweep stopped at its budget never reached the second engine)."""
    monkeypatch.chdir(tmp_path)
    demo_config["engines"]["second"] = {**demo_config["engines"]["llamacpp"], "port": free_port()}
    demo_config["configs"]["S_f16_n0"] = {"engine": "second", "checkpoint": "f16", "speculation": "none"}
    write_config(tmp_path / "grid.yaml", demo_config)
    result = snakemake(tmp_path, "-n", "--scheduler", "greedy", "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    priorities: dict[str, list[int]] = {}
    for rule, block in re.findall(
        r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", result.stdout, re.MULTILINE | re.DOTALL
    ):
        found = re.search(r"priority: (-?\d+)", block)
        priorities.setdefault(rule, []).append(int(found.group(1)) if found else 0)
    assert len(priorities["check_engine"]) == 2
    cells = priorities["bench_cell"] + priorities["natural_cell"]
    assert min(priorities["check_engine"]) > max(cells)


def test_results_brought_from_another_machine_are_kept_and_only_missing_cells_run(tmp_path, demo_config):
    """scripts/restore_results.sh on a machine that has nothing yet: its models, corpus and
    engine check are made there, newer than the brought results, which must still count."""
    demo_config["configs"] = {k: demo_config["configs"][k] for k in ("D_f16_n0", "D_q8_0_n0")}
    demo_config["depths"] = [0, 256]
    demo_config.pop("natural")
    demo_config["load"] = {"prompt_classes": ["code"], "rates": [1], "requests": 2}  # every kind is brought
    workdir = tmp_path / "here"
    workdir.mkdir()
    write_config(workdir / "grid.yaml", demo_config)
    earlier = tmp_path / "earlier/results"
    brought = ("raw/D_f16_n0/depth_0", "raw/D_f16_n0/depth_256", "raw/D_q8_0_n0/depth_0")
    brought += ("load/D_f16_n0/code_poisson_r1",)
    for cell in brought:
        for suffix in (".json", ".provenance.json"):
            (earlier / f"{cell}{suffix}").parent.mkdir(parents=True, exist_ok=True)
            (earlier / f"{cell}{suffix}").write_text('"measured earlier"')
    here = workdir / "results/raw/D_q8_0_n0/depth_0.json"
    here.parent.mkdir(parents=True)
    here.write_text('"measured here"')  # a cell this machine measured wins
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    restore = subprocess.run(
        [
            "bash",
            REPO / "scripts/restore_results.sh",
            tmp_path / "earlier",
            "-s",
            REPO / "Snakefile",
            "--configfile",
            "grid.yaml",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert restore.returncode == 0, restore.stdout + restore.stderr
    assert (workdir / "results/preflight/llamacpp.json").exists()  # checked on this machine
    assert here.read_text() == '"measured here"'
    assert (workdir / "results/raw/D_f16_n0/depth_256.json").read_text() == '"measured earlier"'
    assert (workdir / "results/load/D_f16_n0/code_poisson_r1.json").read_text() == '"measured earlier"'
    assert "4 cells are measured already" in restore.stdout  # D_q8_0_n0's depth 0 counts once

    plan = snakemake(workdir, "-n", "--configfile", str(workdir / "grid.yaml"))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    scheduled = re.findall(r"^    wildcards: config=(\w+), depth=(\d+)$", plan.stdout, re.MULTILINE)
    assert scheduled == [("D_q8_0_n0", "256")]
    load_cell = r"^    wildcards: config=(\w+), prompt_class=code, arrival=poisson"
    loads = re.findall(load_cell, plan.stdout, re.MULTILINE)
    assert loads == ["D_q8_0_n0"]


def test_a_filtered_run_leaves_the_engine_check_and_its_cells_as_they_were(
    tmp_path, demo_config, monkeypatch
):
    """A few configs first (--config config=…), the whole grid later: the engine check
    covers every config on its engine, so neither run makes it, and with it every measured
    cell of that engine, stale (a check per filter re-measured whole engines)."""
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "grid.yaml", demo_config)
    checked = snakemake(tmp_path, "--until", "check_engine", "--configfile", "grid.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for args in (["--config", "config=D_f16_n0"], []):
        plan = snakemake(tmp_path, "-n", "--quiet", "rules", "--configfile", "grid.yaml", *args)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        jobs = dict(re.findall(r"^(\w+) +(\d+)$", plan.stdout, re.MULTILINE))
        assert "check_engine" not in jobs, (args, jobs)
    one = snakemake(
        tmp_path, "-n", "--quiet", "rules", "--configfile", "grid.yaml", "--config", "config=D_f16_n0"
    )
    assert dict(re.findall(r"^(\w+) +(\d+)$", one.stdout, re.MULTILINE))["bench_cell"] == "4"


def test_a_grid_edited_elsewhere_keeps_a_measured_cell(tmp_path, demo_config, monkeypatch):
    """A measured cell stays measured when the grid changes around it: a new report title, a
    depth added, a default written out. The engine's check runs again (it reads the grid),
    but it is a gate, not data: before, its newer file re-measured every cell of the engine."""
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "grid.yaml", demo_config)
    cell = CELL_KINDS["benchy"].patterns.raw.format(config="D_f16_n0", depth=0)
    measured = snakemake(tmp_path, cell, "--configfile", "grid.yaml")
    assert measured.returncode == 0, measured.stdout + measured.stderr + sweep_logs(tmp_path)
    edited = copy.deepcopy(demo_config)
    edited["study"]["title"] = "A new title"
    edited["depths"] = sorted([*edited["depths"], 768])
    edited["serving"]["gpu_memory_utilization"] = 0.9  # the schema's default, now written out
    write_config(tmp_path / "edited.yaml", edited)
    for grid in ("grid.yaml", "edited.yaml"):
        plan = snakemake(tmp_path, cell, "-n", "--configfile", grid)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert "rule bench_cell:" not in plan.stdout, (grid, plan.stdout)


def test_a_grid_edit_that_reruns_the_engine_check_runs_its_cells_in_the_same_run(workdir, demo_config):
    """An overlay on a grid that ran adds a depth and a quality section and changes the
    natural prompts' max_tokens: the engine's check runs again (its grid changed), and the
    same run then measures the new cells and the changed natural cell and writes the quality
    dataset, leaving the unchanged cell as it was. Before, Snakemake did not look at the jobs
    below a check that had to run (the cells' edge to it being ancient): the run did the
    check alone, exit 0, and the cells waited for a second invocation."""
    demo_config["configs"] = {"D_f16_n0": demo_config["configs"]["D_f16_n0"]}
    demo_config["depths"] = [0]
    demo_config["natural"].update(prompt_classes=["code"], concurrency=[1], requests=2, max_tokens=16)
    write_config(workdir / "grid.yaml", demo_config)
    first = snakemake(workdir, "--configfile", "grid.yaml")
    assert first.returncode == 0, first.stdout + first.stderr + sweep_logs(workdir)
    unchanged, changed = (
        workdir / "results/raw/D_f16_n0/depth_0.json",
        workdir / "results/natural/D_f16_n0/code_c1.json",
    )
    measured_at = {path: path.stat().st_mtime_ns for path in (unchanged, changed)}
    overlay = {
        "depths": [0, 256],
        "natural": {"max_tokens": 24},
        "quality": {"prompt_classes": ["code"], "max_tokens": 8},
    }
    write_config(workdir / "more.yaml", overlay)

    edited = snakemake(workdir, "--configfile", "grid.yaml", "more.yaml")
    assert edited.returncode == 0, edited.stdout + edited.stderr + sweep_logs(workdir)
    assert jobs_of_last_run(workdir, "check_engine") == [{"engine": "llamacpp"}]  # the check's grid changed
    assert jobs_of_last_run(workdir, "bench_cell") == [{"config": "D_f16_n0", "depth": "256"}]
    assert jobs_of_last_run(workdir, "natural_cell") == [
        {"config": "D_f16_n0", "prompt_class": "code", "concurrency": "1"}
    ]
    assert jobs_of_last_run(workdir, "quality_cell") == [{"config": "D_f16_n0"}]
    assert unchanged.stat().st_mtime_ns == measured_at[unchanged]
    assert changed.stat().st_mtime_ns > measured_at[changed]
    assert list(pd.read_csv(workdir / "dataset/dataset.csv")["context_tokens"]) == [0, 256]
    assert list(pd.read_csv(workdir / "dataset/quality.csv")["config"]) == ["D_f16_n0"]
    again = snakemake(workdir, "-n", "--configfile", "grid.yaml", "more.yaml")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout


def dry_run_on_placeholders(workdir: Path, *configfiles: str, args: tuple[str, ...] = ()):
    """``snakemake -n`` of GPU study configs in ``workdir``, every file their engines,
    checkpoints and speculations list stood in for by an empty one (no GPU machine in CI)."""
    for configfile in configfiles:
        study = yaml.safe_load((REPO / configfile).read_text())
        for section in ("engines", "checkpoints", "speculations"):
            for entry in study.get(section, {}).values():
                for path in entry.get("files", []):
                    (workdir / path).parent.mkdir(parents=True, exist_ok=True)
                    (workdir / path).touch(mode=0o755)
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").touch(mode=0o755)  # the process engine's check looks it up on PATH
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    command = [
        Path(sys.executable).parent / "snakemake",
        "-s",
        REPO / "Snakefile",
        "-d",
        workdir,
        "-n",
        *args,
    ]
    configs = [REPO / configfile for configfile in configfiles]
    return subprocess.run(
        [*command, "--configfile", *configs], cwd=workdir, env=env, capture_output=True, text=True
    )


def test_the_two_gpu_h200_study_schedules_one_engine_per_gpu(tmp_path):
    """config/studies/h200x2.yaml, dry-run on placeholder files (the two-GPU machine is not
    lent to CI): every config of the vLLM study on one slot each, the tensor-parallel config
    on both, and one config at a time per engine resource."""
    plan = dry_run_on_placeholders(
        tmp_path,
        "config/studies/h200-vllm.yaml",
        "config/studies/h200x2.yaml",
        args=("-j", "2", "--resources", "gpu=2"),
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr
    gpus = {}
    for block in re.findall(r"^rule (?:bench|natural)_cell:\n((?:    .*\n)+)", plan.stdout, re.MULTILINE):
        config = re.search(r"wildcards: config=(\w+)", block).group(1)
        claimed = dict(pair.split("=") for pair in re.search(r"resources: (.*)", block).group(1).split(", "))
        gpus.setdefault(config, set()).add(claimed["gpu"])
        assert claimed[f"engine_{config}"] == "1", block  # one cell of a config at a time
    assert len(gpus) == 13 and gpus.pop("V_bf16_tp2") == {"2"}
    assert set().union(*gpus.values()) == {"1"}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_failed_cell_reruns_alone(workdir, demo_config, runtime):
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = [0, 256, 512]
    demo_config.pop("natural")  # llama-benchy cells only: test_natural_workflow covers the others
    write_config(workdir / "grid.yaml", in_runtime(demo_config, runtime))
    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    wait_for_measuring(proc, workdir / "logs/cells/D_q8_0_n0/depth_256.log")
    kill_engine(slot_state()["handle"])  # the engine dies mid-cell
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0

    failure = json.loads((workdir / "results/failures/D_q8_0_n0/depth_256.json").read_text())
    assert failure["config"] == "D_q8_0_n0" and failure["depth"] == 256
    assert not (workdir / "results/raw/D_q8_0_n0/depth_256.json").exists()
    for depth in (0, 512):  # the other cells are unaffected: a fresh engine took over
        assert (workdir / f"results/raw/D_q8_0_n0/depth_{depth}.json").exists(), output
    assert len([e for e in events(workdir) if e["event"] == "start"]) == 2
    partial = pd.read_csv(workdir / "partial/dataset/dataset.csv")  # a failed run still ends with one
    assert dict(zip(partial["context_tokens"], partial["status"], strict=True)) == {
        0: "ok",
        256: "failed",
        512: "ok",
    }
    assert "died" in partial.loc[partial["context_tokens"] == 256, "reason"].item()
    assert "**Partial results.**" in (workdir / "partial/dataset/comparison.md").read_text()
    assert not (workdir / "dataset").exists()  # the final outputs stay missing until every cell ran

    rerun = snakemake(workdir, "--configfile", "grid.yaml")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert jobs_of_last_run(workdir, "bench_cell") == [{"config": "D_q8_0_n0", "depth": "256"}]
    assert not (workdir / "results/failures/D_q8_0_n0/depth_256.json").exists()
    assert not (workdir / "partial").exists()
    frame = pd.read_csv(workdir / "dataset/dataset.csv")
    assert list(frame["status"]) == ["ok", "ok", "ok"]


@pytest.mark.parametrize(
    "runtime,interrupt",
    [
        ("process", "ctrl-c"),  # SIGINT to the terminal's whole foreground process group
        pytest.param("docker", "sigterm", marks=pytest.mark.docker),  # `kill PID`, a batch system
    ],
)
def test_an_interrupt_stops_every_engine_and_the_rerun_redoes_the_cell(
    workdir, demo_config, runtime, interrupt
):
    demo_config["configs"] = {"D_f16_n0": demo_config["configs"]["D_f16_n0"]}
    demo_config["depths"] = [0, 256, 512]
    demo_config.pop("natural")
    write_config(workdir / "grid.yaml", in_runtime(demo_config, runtime))
    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    wait_for_measuring(proc, workdir / "logs/cells/D_f16_n0/depth_256.log")
    handle = slot_state()["handle"]
    if interrupt == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)  # Snakemake alone: it must interrupt its cells itself
    proc.communicate(timeout=300)
    assert proc.returncode != 0

    assert not engine_alive(handle)
    assert not list(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json"))
    assert not (workdir / "results/raw/D_f16_n0/depth_256.json").exists()
    assert not list((workdir / "results/.tmp").iterdir())
    failure = json.loads((workdir / "results/failures/D_f16_n0/depth_256.json").read_text())
    assert failure["error_type"] == "interrupted"
    missing = [d for d in (0, 256, 512) if not (workdir / f"results/raw/D_f16_n0/depth_{d}.json").exists()]

    rerun = snakemake(workdir, "--configfile", "grid.yaml")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    ran = sorted(int(job["depth"]) for job in jobs_of_last_run(workdir, "bench_cell"))
    assert ran == missing and 256 in ran


@pytest.fixture
def small_results_disk(workdir):
    """results/ on a 16 MiB tmpfs of its own, so that a test can fill it."""
    results = workdir / "results"
    results.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(results)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.decode().strip()}")
    yield results
    subprocess.run(["umount", "--lazy", str(results)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the filesystem refuses another byte."""
    filler = disk / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def test_a_disk_full_mid_cell_keeps_nothing_partial_and_the_rerun_finishes_the_rest(
    workdir, demo_config, small_results_disk
):
    demo_config["configs"] = {"D_f16_n0": demo_config["configs"]["D_f16_n0"]}
    demo_config["depths"] = [0, 256]
    demo_config.pop("natural")
    write_config(workdir / "grid.yaml", demo_config)
    first = snakemake(workdir, "results/raw/D_f16_n0/depth_0.json", "--configfile", "grid.yaml")
    assert first.returncode == 0, first.stdout + first.stderr + sweep_logs(workdir)
    kept_before = {p for p in small_results_disk.rglob("*") if p.is_file()}

    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    cell_log = workdir / "logs/cells/D_f16_n0/depth_256.log"
    wait_for_measuring(proc, cell_log)
    filler = fill(small_results_disk)  # while llama-benchy measures
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, output
    log = cell_log.read_text()
    assert "D_f16_n0 depth 256" in log and ("no space left on device" in log or "KiB left" in log), log
    assert "df -h results" in log and "only the missing cells run" in log  # what to do next
    left = {p for p in small_results_disk.rglob("*") if p.is_file()} - kept_before - {filler}
    assert not left, f"partial files on the full disk: {sorted(map(str, left))}"

    filler.unlink()
    rerun = snakemake(workdir, "--configfile", "grid.yaml")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr + sweep_logs(workdir)
    assert jobs_of_last_run(workdir, "bench_cell") == [{"config": "D_f16_n0", "depth": "256"}]
    frame = pd.read_csv(workdir / "dataset/dataset.csv")
    assert list(frame["status"]) == ["ok", "ok"]


def test_a_second_sweep_in_the_same_directory_is_refused_and_kills_nothing(workdir, demo_config):
    demo_config["configs"] = {"D_f16_n0": demo_config["configs"]["D_f16_n0"]}
    demo_config["depths"] = [0, 256]
    demo_config.pop("natural")
    write_config(workdir / "grid.yaml", demo_config)
    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    wait_for_measuring(proc, workdir / "logs/cells/D_f16_n0/depth_0.log")
    os.killpg(proc.pid, signal.SIGSTOP)  # held mid-cell, so that it cannot finish first
    try:
        second = snakemake(workdir, "--configfile", "grid.yaml")
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    assert second.returncode != 0
    assert "cannot be locked" in second.stdout + second.stderr  # Snakemake's own, clear message
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output + sweep_logs(workdir)
    # had the refused sweep stopped the first one's engine, a cell would have failed or
    # started it again; the one stop is the first sweep's own, at its end
    assert [e["event"] for e in events(workdir) if e["event"] in ("start", "stop")] == ["start", "stop"]


def test_the_real_model_study_sweeps_each_model_to_its_trained_context(tmp_path):
    """config/studies/h200-real.yaml, dry-run on placeholder files: SmolLM2 (8k context) is
    swept to 7168 tokens of depth, Gemma 3 (32k) to 31744, and every config meets the four
    prompt classes at concurrency 1, 4 and 16."""
    plan = dry_run_on_placeholders(tmp_path, "config/studies/h200-real.yaml")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    depths: dict[str, set[int]] = {}
    for config, depth in re.findall(r"wildcards: config=(\w+), depth=(\d+)", plan.stdout):
        depths.setdefault(config, set()).add(int(depth))
    natural = set(re.findall(r"wildcards: config=(\w+), prompt_class=(\w+), concurrency=(\d+)", plan.stdout))
    smollm2 = {0, 2048, 4096, 7168}
    smollm2_configs = "R_bf16_none L_q4_1_none R_bf16_draft4 L_q4_1_draft4 R_bf16_ngram4 L_q4_1_ngram8"
    expected = dict.fromkeys([*smollm2_configs.split(), "L_q8_0_none", "R_fp8_none"], smollm2)
    assert {c: d for c, d in depths.items() if not c.startswith("G_")} == expected
    assert all(d == smollm2 | {16384, 31744} for c, d in depths.items() if c.startswith("G_"))
    assert {(c, p, int(n)) for c, p, n in natural} == {
        (c, p, n) for c in depths for p in ("code", "reasoning", "dialogue", "prose") for n in (1, 4, 16)
    }


def test_the_real_model_studys_quality_and_load_overlay_adds_only_those_cells(tmp_path):
    """config/studies/h200-real-quality-load.yaml after the study: one quality cell per config
    and three load rates each, and the depth and natural cells' contexts as without it."""
    study = "config/studies/h200-real.yaml"
    alone = dry_run_on_placeholders(tmp_path / "alone", study, args=("--quiet", "rules"))
    both = dry_run_on_placeholders(
        tmp_path / "both", study, "config/studies/h200-real-quality-load.yaml", args=("--quiet", "rules")
    )
    assert both.returncode == 0, both.stdout + both.stderr
    counts = {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", both.stdout, re.MULTILINE)}
    before = {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", alone.stdout, re.MULTILINE)}
    assert counts["quality_cell"] == 11 and counts["load_cell"] == 33
    assert (counts["bench_cell"], counts["natural_cell"]) == (before["bench_cell"], before["natural_cell"])
    contexts = [
        sorted(p.name for p in (d / ".gridbench/contexts").iterdir())
        for d in (tmp_path / "alone", tmp_path / "both")
    ]
    assert set(contexts[0]) <= set(contexts[1])  # the measured cells' contexts stay the same
