"""Serve command lines per engine kind: a resolved config in, an argument list out.

Pure functions; values are never joined into a shell string, so a value such as
``x; touch pwned`` stays one literal argument.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from gridbench.grid import ServingConfig


@dataclass(frozen=True)
class LaunchPlan:
    """What an engine start runs: the argv (after any docker entrypoint) and where it listens."""

    argv: tuple[str, ...]
    host: str
    port: int
    served_model_name: str

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell_line(self) -> str:
        return shlex.join(self.argv)


def _fraction(value: float) -> str:
    """0.8 -> "0.80", as the seeds write memory fractions."""
    return f"{value:.2f}" if round(value, 2) == value else repr(value)


def vllm_serve_args(cfg: ServingConfig, host: str, port: int) -> list[str]:
    """``vllm serve`` flags, in the order the seeds' drivers wrote them."""
    ckpt, serving, spec = cfg.checkpoint, cfg.serving, cfg.speculation
    args = [ckpt.model, "--served-model-name", ckpt.served_model_name, "--host", host, "--port", str(port)]
    if ckpt.quantization_flag:
        args += ["--quantization", ckpt.quantization_flag]
    if ckpt.dtype:
        args += ["--dtype", ckpt.dtype]
    args += [
        "--max-model-len",
        str(serving.max_model_len),
        "--gpu-memory-utilization",
        _fraction(serving.gpu_memory_utilization),
        "--enable-prefix-caching" if serving.prefix_caching else "--no-enable-prefix-caching",
        "--enable-chunked-prefill" if serving.chunked_prefill else "--no-enable-chunked-prefill",
        "--tensor-parallel-size",
        str(serving.tensor_parallel_size),
    ]
    if spec.enabled:
        if spec.cli_form == "flags":
            if spec.draft_model:
                args += ["--speculative-model", spec.draft_model]
            args += ["--num-speculative-tokens", str(spec.num_speculative_tokens)]
        else:
            speculative = {"method": spec.method}
            if spec.draft_model:
                speculative["model"] = spec.draft_model
            if spec.num_speculative_tokens is not None:
                speculative["num_speculative_tokens"] = spec.num_speculative_tokens
            speculative.update(spec.extra)
            args += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    return args + list(cfg.serve_args)


# llama.cpp's n-gram types take their draft length from their own flag; the draft-model
# types (and ngram-cache) from --spec-draft-n-max.
LLAMACPP_DRAFT_LENGTH_FLAGS = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}


def llamacpp_serve_args(cfg: ServingConfig, host: str, port: int) -> list[str]:
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
        length_flag = LLAMACPP_DRAFT_LENGTH_FLAGS.get(spec.method, "--spec-draft-n-max")
        args += [length_flag, str(spec.num_speculative_tokens)]
    return args + list(cfg.serve_args)


SERVE_ARGS = {"vllm": vllm_serve_args, "llamacpp": llamacpp_serve_args}


def launch_plan(cfg: ServingConfig, port: int) -> LaunchPlan:
    """The engine's argv: its command prefix, then the kind's serve flags."""
    engine = cfg.engine
    # a bridged container must listen on all its interfaces; the host side stays on engine.host
    listen = "0.0.0.0" if engine.runtime == "docker" and engine.network == "bridge" else engine.host
    argv = (*engine.command, *SERVE_ARGS[engine.kind](cfg, listen, port))
    return LaunchPlan(
        argv=argv, host=engine.host, port=port, served_model_name=cfg.checkpoint.served_model_name
    )
