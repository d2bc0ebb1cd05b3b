"""What an engine kind is: everything gridbench needs to know about one inference server."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from gridbench.engines import probe

if TYPE_CHECKING:
    from gridbench.config.grid import ServingConfig


@dataclass(frozen=True)
class LoadInversionCause:
    """A kind's known cause of latency falling as load rises, and the serve flag that removes it."""

    cause: str  # "its host prompt cache saving idle slots before each request wave"
    fix_flag: str  # as it appears in the serve command: "--cache-ram 0"


class EngineKind(ABC):
    """One server kind. A subclass lives in its own module and is registered in
    ``gridbench.engines.kinds``; nothing else in gridbench names a kind."""

    name: str
    api_key_variable: str  # the server reads its key from here, never from its command line
    speculation_methods: frozenset[str]
    draft_model_methods: frozenset[str]  # the methods that need a draft_model
    metrics_prefix: str  # of its Prometheus names, e.g. "vllm:"
    version_path: str  # a GET that answers JSON with the version under version_key
    version_key: str
    # it closes a streamed response's connection right after the last chunk without saying
    # so, and a client that reuses the connection loses its next request
    closes_streamed_connections: bool = False
    label: str  # how the report names the server
    load_inversion_cause: LoadInversionCause | None = None
    # what a chat request adds so that its response's logprobs name each generated token's id
    # (a quality cell compares greedy outputs token by token; without ids, by characters)
    token_id_fields: Mapping[str, bool] = MappingProxyType({})
    # how a quality cell gets teacher-forced log-probabilities from it (harness/teacher_forced.py's
    # FORCED_STEPS or PROMPT_LOGPROBS); None: it gives none
    teacher_forcing: str | None = None
    # the environment variable that names the folder where it keeps what it compiles at start-up
    # (compiled graphs, kernels) for a later start to load; None: it keeps no such cache
    compile_cache_variable: str | None = None
    # the sub-folders of that folder whose files are compiled artifacts: a start that finds
    # any there finds the cache warm
    compile_cache_artifacts: tuple[str, ...] = ()
    # a line of its log that says a start compiled (a miss), and one that says it loaded
    # what an earlier start compiled (a hit): regular expressions, searched line by line
    compile_cache_miss_line: str | None = None
    compile_cache_hit_line: str | None = None
    # a streamed response's text chunk carries every token one engine step made: with
    # speculation, a request's tokens less its chunks (after the first, the prefill's) are the
    # drafted tokens its steps accepted, as the client sees them (aggregate/stream_steps.py)
    streams_a_step_per_chunk: bool = False
    # the Python distribution a local process runs (its command a script of that Python): its
    # installed version names the process's build in the compile cache's key
    distribution: str | None = None
    # its answer to a request rounds differently by what it served before (where earlier
    # requests left their keys and values), so a greedy near-tie may flip on a warm engine:
    # a quality cell then asks for a fresh one
    answers_depend_on_what_it_served: bool = False
    # where a streamed response's usage chunk says how many of the prompt's tokens came from
    # the prefix cache: the dotted key of that chunk's integer (sse.StreamChunk.counts); None:
    # it says nothing of it
    cached_prompt_tokens_key: str | None = None
    # the serve flags without which it leaves that count out (a session cell's engine adds them)
    cached_prompt_tokens_flags: tuple[str, ...] = ()

    def cached_prompt_tokens(self, counts: Mapping[str, int]) -> int | None:
        """The prompt tokens a response took from the prefix cache, from its usage chunk's
        integers by dotted key; None where the chunk does not say."""
        return None if self.cached_prompt_tokens_key is None else counts.get(self.cached_prompt_tokens_key)

    def fresh_prompt_fields(self, nonce: str) -> Mapping[str, bool | str]:
        """What a chat request adds so that no cache of earlier requests' prompts serves it:
        a prompt computed over cached keys and values rounds differently from one computed
        whole, which flips a greedy near-tie, so a quality cell's answers would depend on what
        the engine served before. ``nonce`` is unique to the request. None by default."""
        return {}

    @abstractmethod
    def serve_args(self, cfg: ServingConfig, host: str, port: int) -> list[str]:
        """The serve flags after the engine's command prefix; pure."""

    def cpu_threads(self, args: Sequence[str]) -> int | None:
        """The compute threads that these serve flags give it on a CPU, or None where they do not
        say (or the kind has no such flag)."""
        return None

    def version(self, base_url: str, headers: Mapping[str, str] | None = None) -> str | None:
        """The version the running server reports, or None."""
        status, body = probe.http_get(base_url + self.version_path, headers=headers)
        if status != 200:
            return None
        try:
            version = json.loads(body).get(self.version_key)
            return None if version is None else str(version)
        except (json.JSONDecodeError, AttributeError):
            return None

    def reset_prefix_cache(self, base_url: str, headers: Mapping[str, str] | None = None) -> bool:
        """Empty the server's prefix cache where it allows it; True when it did."""
        return False

    @property
    def spec_metrics_prefix(self) -> str:
        return f"{self.metrics_prefix}spec_decode_"
