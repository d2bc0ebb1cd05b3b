"""vLLM's ``vllm serve``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from gridbench.engines import probe
from gridbench.engines.kinds.base import EngineKind
from gridbench.util.files import JsonObject

if TYPE_CHECKING:
    from gridbench.config.grid import ServingConfig


def _fraction(value: float) -> str:
    """0.8 -> "0.80", as the seeds write memory fractions."""
    return f"{value:.2f}" if round(value, 2) == value else repr(value)


def prefix_cache_was_reset(status: int, body: str) -> bool:
    """Whether vLLM's answer to POST /reset_prefix_cache means the cache is empty.

    vLLM serves the route only with VLLM_SERVER_DEV_MODE=1 (404 otherwise). vLLM 0.32
    answers 200 with {"success": false} while blocks are still held; older releases
    answered 200 with an empty body."""
    if status != 200:
        return False
    try:
        answer = json.loads(body)
    except json.JSONDecodeError:
        return True
    return not isinstance(answer, dict) or answer.get("success", True) is True


class VLLM(EngineKind):
    name = "vllm"
    label = "vLLM"
    api_key_variable = "VLLM_API_KEY"
    speculation_methods = frozenset(
        {"dflash", "dspark", "mtp", "eagle", "eagle3", "draft_model", "ngram", "medusa", "suffix"}
    )
    draft_model_methods = frozenset({"dflash", "dspark", "eagle", "eagle3", "draft_model", "medusa"})
    metrics_prefix = "vllm:"
    version_path = "/version"
    version_key = "version"
    # its logprobs then name each token "token_id:N" in place of its text
    token_id_fields = MappingProxyType({"return_tokens_as_token_ids": True})
    teacher_forcing = "prompt-logprobs"  # /v1/completions' prompt_logprobs, in one request
    # VLLM_CACHE_ROOT (default ~/.cache/vllm) holds torch_compile_cache/<hash>/: the compiled
    # graphs, with the inductor and Triton caches inside them (vllm/compilation/backends.py,
    # compiler_interface.py) and torch_aot_compile/; CUDA graphs are captured anew at each
    # start from these. --enforce-eager (or -cc.mode=none) compiles nothing and writes none.
    compile_cache_variable = "VLLM_CACHE_ROOT"
    compile_cache_artifacts = ("torch_compile_cache",)
    # vllm/compilation/backends.py and decorators.py: a graph compiled, or the AOT artifact
    # found but not loaded (it compiles again); a graph or the AOT artifact loaded
    compile_cache_miss_line = (
        r"Compiling a graph for compile range|Compiling model again due to a load failure"
    )
    compile_cache_hit_line = r"Directly load the compiled graph|Directly load AOT compilation"
    distribution = "vllm"
    # the output processor sends one delta per step (stream_interval 1), drafted tokens with it
    streams_a_step_per_chunk = True
    # the OpenAI usage block's cached_tokens, which vLLM fills in only when served with
    # --enable-prompt-tokens-details (otherwise prompt_tokens_details is null)
    cached_prompt_tokens_key = "usage.prompt_tokens_details.cached_tokens"
    cached_prompt_tokens_flags = ("--enable-prompt-tokens-details",)

    def fresh_prompt_fields(self, nonce: str) -> Mapping[str, bool | str]:
        return {"cache_salt": nonce}  # a prefix cache of its own, which nothing else fills

    def serve_args(self, cfg: ServingConfig, host: str, port: int) -> list[str]:
        """``vllm serve`` flags, in the order the seeds' drivers wrote them."""
        ckpt, serving, spec = cfg.checkpoint, cfg.serving, cfg.speculation
        args = [
            ckpt.model,
            "--served-model-name",
            ckpt.served_model_name,
            "--host",
            host,
            "--port",
            str(port),
        ]
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
                speculative: JsonObject = {"method": spec.method}
                if spec.draft_model:
                    speculative["model"] = spec.draft_model
                if spec.num_speculative_tokens is not None:
                    speculative["num_speculative_tokens"] = spec.num_speculative_tokens
                speculative.update(spec.extra)
                args += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
        return args + list(cfg.serve_args)

    def reset_prefix_cache(self, base_url: str, headers: Mapping[str, str] | None = None) -> bool:
        return prefix_cache_was_reset(*probe.http_post(base_url + "/reset_prefix_cache", headers=headers))


KIND = VLLM()
