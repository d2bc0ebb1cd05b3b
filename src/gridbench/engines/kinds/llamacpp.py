"""llama.cpp's ``llama-server``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gridbench.engines.kinds.base import EngineKind, LoadInversionCause

if TYPE_CHECKING:
    from gridbench.config.grid import ServingConfig

# llama.cpp's n-gram types take their draft length from their own flag; the draft-model
# types (and ngram-cache) from --spec-draft-n-max.
DRAFT_LENGTH_FLAGS = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}


class LlamaCpp(EngineKind):
    name = "llamacpp"
    label = "llama.cpp"
    # no prompt log-probabilities: one /completion per position, its next token forced by logit_bias
    teacher_forcing = "forced-steps"
    # studies/h200-vllm/README.md; serve_args turns it off with prefix caching
    load_inversion_cause = LoadInversionCause(
        "its host prompt cache saving idle slots before each request wave (studies/h200-vllm/README.md)",
        "--cache-ram 0",
    )
    api_key_variable = "LLAMA_API_KEY"
    speculation_methods = frozenset(
        {
            "draft-simple",
            "draft-mtp",
            "ngram-simple",
            "ngram-mod",
            "ngram-map-k",
            "ngram-map-k4v",
            "ngram-cache",
        }
    )
    draft_model_methods = frozenset({"draft-simple"})
    metrics_prefix = "llamacpp:"
    version_path = "/props"
    version_key = "build_info"
    # its chunk provider returns false after the last chunk, so cpp-httplib closes the
    # connection (tests/test_benchy_connections.py shows it)
    closes_streamed_connections = True
    # no reset_prefix_cache: llama.cpp reuses slots per request, and with prefix caching off
    # the server runs with --no-cache-prompt
    # its one KV buffer (--kv-unified) places a request's cells after what other slots still
    # hold, and the sums over them round by where they lie: on the demo's Q4_1 SmolLM2, the
    # reasoning answer after four concurrent requests parts from a fresh server's at token 54,
    # whose runner-up trails by 0.24 nats (tests/test_quality.py)
    answers_depend_on_what_it_served = True
    # llama-server's final chunk carries its timings: cache_n prompt tokens taken from the
    # slot's cache, prompt_n evaluated (the xllamacpp build the tests run also mirrors cache_n as
    # usage.prompt_tokens_details.cached_tokens; timings is the older and native one)
    cached_prompt_tokens_key = "timings.cache_n"

    def fresh_prompt_fields(self, nonce: str) -> Mapping[str, bool | str]:
        return {"cache_prompt": False}  # the slot's cached prefix is not reused

    def serve_args(self, cfg: ServingConfig, host: str, port: int) -> list[str]:
        """``llama-server`` flags; /metrics is always on, since acceptance is read there."""
        ckpt, serving, spec = cfg.checkpoint, cfg.serving, cfg.speculation
        args = [
            "-m",
            ckpt.model,
            "--alias",
            ckpt.served_model_name,
            "--host",
            host,
            "--port",
            str(port),
            "-c",
            str(serving.max_model_len),
            "-np",
            str(serving.parallel_slots),
            "--metrics",
        ]
        if not serving.prefix_caching:
            # --cache-ram 0 too: llama-server's host prompt cache (8 GiB by default) otherwise saves
            # every idle slot's KV on each new request, 135-445 ms of TTFT per wave on an H200
            # (studies/h200-vllm), for prompts that --no-cache-prompt never lets it reuse
            args += ["--no-cache-prompt", "--cache-ram", "0"]
        if spec.enabled:
            args += ["--spec-type", spec.method]
            if spec.draft_model:
                args += ["-md", spec.draft_model]
            length_flag = DRAFT_LENGTH_FLAGS.get(spec.method, "--spec-draft-n-max")
            args += [length_flag, str(spec.num_speculative_tokens)]
        return args + list(cfg.serve_args)

    def cpu_threads(self, args: Sequence[str]) -> int | None:
        """-t/--threads N (or --threads=N); the last one given wins, as in llama-server."""
        threads = None
        for flag, value in zip(args, [*args[1:], None], strict=False):
            if flag in ("-t", "--threads") and value is not None:
                threads = value
            elif flag.startswith("--threads="):
                threads = flag.split("=", 1)[1]
        try:
            return None if threads is None else int(threads)
        except ValueError:
            return None  # llama-server itself refuses it, with its own message


KIND = LlamaCpp()
