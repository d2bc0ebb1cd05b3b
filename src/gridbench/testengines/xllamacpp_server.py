"""``llama-server`` on the CPU, from the prebuilt PyPI wheel ``xllamacpp``.

The wheel embeds llama.cpp's own HTTP server but has no command line, so this module
accepts the subset of ``llama-server`` flags that gridbench's llamacpp command builder
emits and maps them onto ``xllamacpp.CommonParams``. It imports only the standard library
and xllamacpp, so it is copied as a single file into the CPU engine image.

usage: python xllamacpp_server.py -m MODEL.gguf --port 8080 [llama-server flags]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import xllamacpp as xlc

SPEC_TYPES = {
    "none": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE,
    "draft-simple": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE,
    "ngram-simple": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE,
    "ngram-map-k": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K,
    "ngram-map-k4v": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V,
    "ngram-mod": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_MOD,
    "ngram-cache": xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_CACHE,
}

# The n-gram types' own settings: flag -> (CommonParams.speculative member, its field).
NGRAM_FLAGS = {
    "--spec-ngram-simple-size-n": ("ngram_simple", "size_n"),
    "--spec-ngram-simple-size-m": ("ngram_simple", "size_m"),
    "--spec-ngram-simple-min-hits": ("ngram_simple", "min_hits"),
    "--spec-ngram-map-k-size-m": ("ngram_map_k", "size_m"),
    "--spec-ngram-map-k4v-size-m": ("ngram_map_k4v", "size_m"),
    "--spec-ngram-mod-n-max": ("ngram_mod", "n_max"),
    "--spec-ngram-mod-n-min": ("ngram_mod", "n_min"),
    "--spec-ngram-mod-n-match": ("ngram_mod", "n_match"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llama-server (xllamacpp)")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-a", "--alias", action="append", default=[])
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("-np", "--parallel", type=int, default=1)
    # llama-server's flag: every slot may use the whole context (-c), not a 1/np share
    parser.add_argument("-kvu", "--kv-unified", action="store_true")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--no-cache-prompt", action="store_true")
    parser.add_argument("-cram", "--cache-ram", type=int, default=None)
    parser.add_argument("-md", "--model-draft")
    parser.add_argument("--spec-type", choices=sorted(SPEC_TYPES), default=None)
    parser.add_argument("--spec-draft-n-max", type=int, default=None)
    parser.add_argument("--spec-draft-n-min", type=int, default=None)
    parser.add_argument("--spec-draft-p-min", type=float, default=None)
    for flag in NGRAM_FLAGS:
        parser.add_argument(flag, type=int, default=None)
    parser.add_argument("--api-key", default=None)
    # a Jinja chat template in place of the GGUF's own (a base model has none)
    parser.add_argument("--chat-template-file", default=None)
    return parser.parse_args(argv)


def build_params(args: argparse.Namespace) -> xlc.CommonParams:
    params = xlc.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.kv_unified = args.kv_unified
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_gpu_layers = args.n_gpu_layers
    params.endpoint_metrics = args.metrics
    params.cache_prompt = not args.no_cache_prompt
    if args.cache_ram is not None:
        params.cache_ram_mib = args.cache_ram
    if args.alias:
        params.model_alias = set(args.alias)
    api_key = args.api_key or os.environ.get("LLAMA_API_KEY")  # llama-server reads it there too
    if api_key:
        params.api_keys = [api_key]
    if args.chat_template_file:  # llama-server reads the file's text into the same field
        params.chat_template = Path(args.chat_template_file).read_text(encoding="utf-8")
    spec_type = args.spec_type or ("draft-simple" if args.model_draft else None)
    if spec_type:
        spec = params.speculative
        spec.types = [SPEC_TYPES[spec_type]]
        if args.model_draft:
            spec.draft.mparams.path = args.model_draft
            spec.draft.cpuparams.n_threads = args.threads
            spec.draft.cpuparams_batch.n_threads = args.threads
        if args.spec_draft_n_max is not None:
            spec.draft.n_max = args.spec_draft_n_max
        if args.spec_draft_n_min is not None:
            spec.draft.n_min = args.spec_draft_n_min
        if args.spec_draft_p_min is not None:
            spec.draft.p_min = args.spec_draft_p_min
        for flag, (member, field) in NGRAM_FLAGS.items():
            value = getattr(args, flag.lstrip("-").replace("-", "_"))
            if value is not None:
                setattr(getattr(spec, member), field, value)
    return params


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    server = xlc.Server(build_params(args))
    print(f"llama-server (xllamacpp {xlc.__version__}) listening on {server.listening_address}", flush=True)  # noqa: T201 - the engine's log
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
