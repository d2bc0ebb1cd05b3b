"""A draft head's recipe, step by step (workflow/rules/drafts.smk calls each through
``gridbench draft STEP``): prompts built here; the target's answers, the dataset, the hidden
states and the training run by the draft's ``python`` (gridbench.drafts.worker and
speculators' own CLI). Each step writes what it did to its step record; the last gathers them,
with the data's checksums and the loss curve, into the recipe's record (RECIPE.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import resources
from itertools import count, takewhile
from pathlib import Path

import yaml

import gridbench
from gridbench import layout
from gridbench.assets.manifest import sha256_of
from gridbench.config.grid import DraftRecipe, Grid
from gridbench.drafts.corpus import build_prompts
from gridbench.drafts.records import EpochLoss, StepFacts
from gridbench.errors import ConfigError, DraftStepError
from gridbench.util import codec
from gridbench.util.files import atomic_write_json, atomic_write_text


@dataclass(frozen=True)
class RecipeRecord:
    """RECIPE.json: what a head was trained from and how."""

    draft: str
    recipe: DraftRecipe
    steps: tuple[StepFacts, ...]
    sha256: dict[str, str]  # the data's and both heads' files
    loss_curve: tuple[EpochLoss, ...]
    wall_s: float  # every step's command, end to end
    gpu_minutes: float  # the commands of the steps that ran on a GPU


@dataclass(frozen=True)
class DraftPaths:
    """Where one draft's steps write (layout's DRAFT_* patterns, filled in); its data (prompts,
    answers, dataset and hidden states) are those of ``data_draft``, itself unless the recipe
    names another's."""

    draft: str
    data_draft: str

    @classmethod
    def of(cls, recipe: DraftRecipe) -> DraftPaths:
        return cls(recipe.name, recipe.data_draft)

    def _fill(self, pattern: str, **more: str) -> Path:
        return Path(pattern.format(draft=self.draft, **more))

    def _data(self, pattern: str, **more: str) -> Path:
        return Path(pattern.format(draft=self.data_draft, **more))

    @property
    def folder(self) -> Path:
        return self._fill(layout.DRAFT_DIR)

    @property
    def prompts(self) -> Path:
        return self._data(layout.DRAFT_PROMPTS)

    @property
    def answers(self) -> Path:
        return self._data(layout.DRAFT_ANSWERS)

    @property
    def prepared(self) -> Path:
        return self._data(layout.DRAFT_PREPARED)

    def step(self, step: str) -> Path:
        return (self._fill if step == "train" else self._data)(layout.DRAFT_STEP, step=step)

    @property
    def own_steps(self) -> tuple[str, ...]:
        """The steps this draft runs: all, or only the training when it reads another's data."""
        return layout.DRAFT_STEPS if self.data_draft == self.draft else ("train",)

    @property
    def head(self) -> Path:
        return self._fill(layout.DRAFT_HEAD)

    @property
    def untrained_head(self) -> Path:
        return self._fill(layout.DRAFT_UNTRAINED_HEAD)

    @property
    def train_metrics(self) -> Path:
        return self._fill(layout.DRAFT_TRAIN_METRICS)

    @property
    def record(self) -> Path:
        return self._fill(layout.DRAFT_RECORD)


def write_recipe_files(grid: Grid) -> None:
    """Each draft's recipe where its steps read it (layout.DRAFT_RECIPE_FILE), rewritten only
    when it changed."""
    for name, recipe in grid.drafts.items():
        path = Path(layout.DRAFT_RECIPE_FILE.format(draft=name))
        text = json.dumps(codec.to_json(recipe), indent=1, sort_keys=True) + "\n"
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)


def unserved_head_files(grid: Grid, configs: Iterable[str]) -> set[str]:
    """The head files of the grid's drafts (trained and untrained) that none of these configs
    serves: a run that measures only those configs has no reason to train them."""
    heads = {
        str(folder / name)
        for paths in map(DraftPaths.of, grid.drafts.values())
        for folder in (paths.head, paths.untrained_head)
        for name in layout.DRAFT_HEAD_FILES
    }
    return heads.difference(*(grid.configs[c].files for c in configs))


def read_recipe(path: Path) -> DraftRecipe:
    try:
        return codec.from_json(DraftRecipe, json.loads(path.read_text()))
    except FileNotFoundError as err:
        raise ConfigError(
            f"draft recipe {path} does not exist",
            hint="the workflow writes it; run snakemake, not this by hand",
        ) from err


def evaluation_prompts() -> set[str]:
    """The packaged seed prompts, which a head is measured on and so never trains on."""
    text = resources.files("gridbench.data").joinpath("prompts.yaml").read_text()
    return set(yaml.safe_load(text).values())


def write_prompts(recipe: DraftRecipe, paths: DraftPaths) -> StepFacts:
    started = time.perf_counter()
    prompts = build_prompts(recipe.prompts, recipe.seed, evaluation_prompts())
    paths.prompts.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.prompts, "".join(json.dumps(asdict(p)) + "\n" for p in prompts))
    by_class: dict[str, int] = {}
    for prompt in prompts:
        by_class[prompt.prompt_class] = by_class.get(prompt.prompt_class, 0) + 1
    return StepFacts(
        step="prompts",
        wall_s=round(time.perf_counter() - started, 1),
        rows=len(prompts),
        by_class=by_class,
        python=sys.version.split()[0],  # the standard library the corpus was read from
        sha256=sha256_of(paths.prompts),
    )


def _answers_command(recipe: DraftRecipe, paths: DraftPaths) -> list[str]:
    return [
        *(recipe.python, "-m", "gridbench.drafts.worker", "respond", "--model", recipe.model),
        *("--prompts", str(paths.prompts), "--out", str(paths.answers)),
        *("--max-tokens", str(recipe.max_tokens), "--seq-length", str(recipe.seq_length)),
        *("--seed", str(recipe.seed), "--llm-args", json.dumps(recipe.llm_args)),
    ]


def _dataset_command(recipe: DraftRecipe, paths: DraftPaths) -> list[str]:
    # the rows carry their tokens and loss mask: speculators renders no chat, it counts the
    # tokens' frequencies (the draft vocabulary) and writes its dataset
    return [
        *(recipe.python, "-m", "speculators", "prepare-data", "--model", recipe.model),
        *("--data", str(paths.answers), "--output", str(paths.prepared)),
        *("--seq-length", str(recipe.seq_length), "--seed", str(recipe.seed)),
        *("--no-skip-token-freq", "--num-preprocessing-workers", "1"),
    ]


def _hidden_states_command(recipe: DraftRecipe, paths: DraftPaths) -> list[str]:
    return [
        *(recipe.python, "-m", "gridbench.drafts.worker", "hidden-states", "--model", recipe.model),
        *("--data", str(paths.prepared), "--out", str(paths.prepared / "hidden_states")),
        *("--seed", str(recipe.seed), "--dtype", recipe.dtype),
    ]


def _train_command(recipe: DraftRecipe, paths: DraftPaths) -> list[str]:
    return [
        *(recipe.python, "-m", "gridbench.drafts.worker", "train", "--model", recipe.model),
        *("--data", str(paths.prepared), "--method", recipe.method),
        *("--head", str(paths.head), "--untrained-head", str(paths.untrained_head)),
        *("--metrics", str(paths.train_metrics), "--scratch", str(paths.head.parent / "checkpoints")),
        *("--draft-vocab-size", str(recipe.draft_vocab_size), "--total-seq-len", str(recipe.total_seq_len)),
        *("--epochs", str(recipe.epochs), "--lr", str(recipe.lr), "--seed", str(recipe.seed)),
        *("--threads", str(recipe.threads), "--dtype", recipe.dtype),
        *_optional_flags(
            {
                "--num-layers": recipe.draft_layers,
                "--block-size": recipe.block_size,
                "--max-anchors": recipe.max_anchors,
            }
        ),
    ]


def _optional_flags(flags: dict[str, int | None]) -> list[str]:
    """The flags set in the recipe; the others take speculators' default for the method."""
    return [part for flag, value in flags.items() if value is not None for part in (flag, str(value))]


# the heavy steps, each run by the draft's own interpreter
WORKER_COMMANDS: dict[str, Callable[[DraftRecipe, DraftPaths], list[str]]] = {
    "answers": _answers_command,
    "dataset": _dataset_command,
    "hidden-states": _hidden_states_command,
    "train": _train_command,
}


def worker_command(recipe: DraftRecipe, paths: DraftPaths, step: str) -> list[str]:
    if step not in WORKER_COMMANDS:
        raise ConfigError(f"no command runs draft step {step!r}; those that do: {', '.join(WORKER_COMMANDS)}")
    return WORKER_COMMANDS[step](recipe, paths)


def run_worker(recipe: DraftRecipe, paths: DraftPaths, step: str) -> StepFacts:
    """Run a heavy step with the draft's interpreter and environment, its output streamed to
    this process's (the rule's log); its facts are the worker's RECIPE-STEP line."""
    command = worker_command(recipe, paths, step)
    source_root = str(Path(gridbench.__file__).resolve().parents[1])
    env = {
        **os.environ,
        **recipe.env,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")])),
    }
    sys.stdout.write("$ " + " ".join(command) + "\n")
    sys.stdout.flush()
    started = time.perf_counter()
    facts = None
    try:
        pipe, merged = subprocess.PIPE, subprocess.STDOUT
        with subprocess.Popen(command, env=env, stdout=pipe, stderr=merged, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                if line.startswith("RECIPE-STEP "):
                    facts = codec.from_json(StepFacts, json.loads(line.removeprefix("RECIPE-STEP ")))
            code = proc.wait()
    except FileNotFoundError as err:
        raise DraftStepError(
            f"draft {paths.draft}, step {step}: cannot run {recipe.python!r}: {err.strerror}",
            hint="set the draft's python to an interpreter with vllm, torch, transformers and speculators",
        ) from err
    if code != 0:
        raise DraftStepError(
            f"draft {paths.draft}, step {step} exited with {code}",
            hint="its output is above in this log; fix the cause and rerun the workflow (done steps stay)",
        )
    command_wall_s = round(time.perf_counter() - started, 1)
    facts = facts or StepFacts(step=step, wall_s=command_wall_s)  # speculators' own CLI says nothing
    return StepFacts(**{**asdict(facts), "step": step, "command_wall_s": command_wall_s})


def run_step(recipe: DraftRecipe, paths: DraftPaths, step: str) -> StepFacts:
    """Run one step and write its record; the train step also writes the recipe's record."""
    if step not in paths.own_steps:
        raise ConfigError(
            f"draft {paths.draft} trains on {paths.data_draft}'s data: it has no {step} step of its own",
            hint=f"run draft {paths.data_draft}'s {step} step instead (the workflow does)",
        )
    if step == "train" and not (paths.prepared / "hidden_states").is_dir():
        raise DraftStepError(
            f"draft {paths.draft}: the hidden states of {paths.data_draft} are not in {paths.prepared},"
            " though its records say they were made: it was carried in without them (gridbench draft import)",
            hint=f"make them again: snakemake -j1 --forcerun draft_dataset ({paths.data_draft} retrains too)",
        )
    if step == "dataset":  # a fresh dataset: the hidden states below it belong to the old one
        shutil.rmtree(paths.prepared, ignore_errors=True)
    facts = write_prompts(recipe, paths) if step == "prompts" else run_worker(recipe, paths, step)
    atomic_write_json(paths.step(step), codec.to_json(facts))
    if step == "train":
        atomic_write_json(paths.record, codec.to_json(recipe_record(recipe, paths)))
    return facts


def recipe_record(recipe: DraftRecipe, paths: DraftPaths) -> RecipeRecord:
    """The recipe, the facts of each step it ran (not those of a draft whose data it reads),
    the checksums of the data and both heads, the loss curve by epoch and the device time."""
    steps = tuple(
        codec.from_json(StepFacts, json.loads(paths.step(step).read_text()))
        for step in paths.own_steps
        if paths.step(step).exists()
    )
    heads = {"head": paths.head, "untrained": paths.untrained_head}
    return RecipeRecord(
        draft=recipe.name,
        recipe=recipe,
        steps=steps,
        sha256={
            "prompts": sha256_of(paths.prompts),
            "answers": sha256_of(paths.answers),
            **{f"{name}/{f}": sha256_of(d / f) for name, d in heads.items() for f in layout.DRAFT_HEAD_FILES},
        },
        loss_curve=loss_curve(paths.train_metrics.read_text().splitlines()),
        wall_s=round(sum(s.command_wall_s or s.wall_s for s in steps), 1),
        gpu_minutes=round(sum(s.command_wall_s or s.wall_s for s in steps if s.device != "cpu") / 60, 2),
    )


def loss_curve(metrics_lines: Iterable[str]) -> tuple[EpochLoss, ...]:
    """Per epoch: steps, the mean training loss and position-0 accuracy, and the validation
    loss and accuracy per draft position, from the trainer's metrics (one JSON line per step
    and per validation; other lines, such as its config, are skipped)."""
    train: dict[int, list[tuple[float, float]]] = {}
    validation: dict[int, tuple[float | None, tuple[float, ...]]] = {}
    for line in filter(str.strip, metrics_lines):
        record = json.loads(line)
        if "train" in record:
            step = record["train"]
            first = (_accuracy_by_position(step) or (0.0,))[0]
            train.setdefault(int(record["epoch"]), []).append((step["loss"], first))
        elif "val" in record:
            val = record["val"]
            validation[int(record["epoch"])] = (val.get("loss_epoch"), _accuracy_by_position(val, "_epoch"))
    return tuple(
        EpochLoss(
            epoch=epoch,
            steps=len(steps),
            train_loss_mean=sum(loss for loss, _ in steps) / len(steps),
            train_accuracy_0_mean=sum(accuracy for _, accuracy in steps) / len(steps),
            val_loss=validation.get(epoch, (None, ()))[0],
            val_accuracy_by_position=validation.get(epoch, (None, ()))[1],
        )
        for epoch, steps in sorted(train.items())
    )


def _accuracy_by_position(metrics: dict[str, float], suffix: str = "") -> tuple[float, ...]:
    """The accuracy of each drafted position, the first drafted token's first: EAGLE-3 names
    them full_acc_0, full_acc_1 ...; DFlash position_1_acc ... (its block's position 0 is the
    bonus token, which it does not draft); DSpark position_0_acc ... (it drafts the anchor too)."""
    for names in (
        (f"full_acc_{i}{suffix}" for i in count()),
        (f"position_{i}_acc{suffix}" for i in count()),
        (f"position_{i}_acc{suffix}" for i in count(1)),
    ):
        present = takewhile(lambda name: name in metrics, names)
        found = tuple(metrics[name] for name in present)
        if found:
            return found
    return ()
