"""The natural-prompt harness's settings and prompts, apart from its HTTP client: the
plan and the cells' contexts need them, and Snakemake parses the plan on every run, where
importing aiohttp would cost a quarter second."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from gridbench.errors import ConfigError
from gridbench.harness.arrivals import AUTO_PROCESSES, LoadSettings
from gridbench.util import codec
from gridbench.util.files import JsonObject


@dataclass(frozen=True)
class NaturalSettings:
    """The config's ``natural`` section (schema defaults filled in)."""

    prompt_classes: tuple[str, ...]
    prompt_file: str | None
    concurrency: tuple[int, ...]
    requests: int
    max_tokens: int
    temperature: float
    warmup: int
    cache_bust: bool
    extra_body: JsonObject
    max_error_rate: float
    request_timeout_s: float
    # "auto" or a count (natural.harness_processes). A cell's context leaves the default out:
    # it changes how many requests fit, not what a cell measures, and the contexts (the
    # cells' params) of studies measured before the key existed stay as they were
    processes: int | str = field(default=AUTO_PROCESSES, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class QualitySettings:
    """The config's ``quality`` section, resolved: the prompt classes and file its cells send
    (the natural section's when it names none), and the reference config, if declared."""

    prompt_classes: tuple[str, ...]
    prompt_file: str | None
    max_tokens: int
    reference: str | None
    extra_body: JsonObject
    teacher_forced_tokens: int  # 0: no teacher-forced pass
    teacher_forced_top_k: int


@dataclass(frozen=True)
class Conversation:
    """How a session cell converses: what its context holds of the sessions section. The
    classes and session counts are the cells' coordinates, so adding one measures no cell again."""

    turns: int
    follow_ups: tuple[str, ...]
    max_tokens: int
    temperature: float
    warmup: int
    extra_body: JsonObject
    request_timeout_s: float

    def follow_up(self, turn: int) -> str:
        """The user's message of ``turn`` (2, 3, ...): the follow-ups in order, repeating."""
        return self.follow_ups[(turn - 2) % len(self.follow_ups)]


@dataclass(frozen=True)
class SessionSettings:
    """The config's ``sessions`` section (schema defaults filled in)."""

    prompt_classes: tuple[str, ...]
    prompt_file: str | None
    sessions: tuple[int, ...]
    conversation: Conversation = field(metadata=codec.INLINE)


# the schema has checked it: "auto" or a count, as written
codec.converter.register_structure_hook(int | str, lambda value, _: value)


def load_prompts(prompt_file: str | Path | None) -> dict[str, str]:
    """Prompt strings by class: the packaged seed prompts, or a study's own YAML/JSON file."""
    if prompt_file is None:
        text = resources.files("gridbench").joinpath("data/prompts.yaml").read_text()
        source = "the packaged prompts"
    else:
        try:
            text = Path(prompt_file).read_text()
        except FileNotFoundError as err:
            raise ConfigError(
                f"natural.prompt_file {prompt_file} does not exist",
                hint="point natural.prompt_file at a YAML or JSON file of class: prompt, or drop it",
            ) from err
        source = str(prompt_file)
    try:
        prompts = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source} is not valid YAML or JSON: {err}") from err
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in prompts.items()
    ):
        raise ConfigError(
            f"{source} must map prompt class names to non-empty prompt strings",
            hint='e.g. code: "Write a complete Python implementation of quicksort ..."',
        )
    return prompts


def resolve_prompts(
    settings: NaturalSettings | QualitySettings | LoadSettings | SessionSettings,
) -> dict[str, str]:
    """The prompt of every class the study runs; an unknown class is a config error."""
    sections = {NaturalSettings: "natural", QualitySettings: "quality", LoadSettings: "load"}
    section = sections.get(type(settings), "sessions")
    prompts = load_prompts(settings.prompt_file)
    unknown = [c for c in settings.prompt_classes if c not in prompts]
    if unknown:
        raise ConfigError(
            f"{section}.prompt_classes: unknown class {', '.join(unknown)}; "
            f"allowed values: {', '.join(prompts)}",
            hint=f"fix {section}.prompt_classes or add the class to its prompt_file",
        )
    return {c: prompts[c] for c in settings.prompt_classes}
