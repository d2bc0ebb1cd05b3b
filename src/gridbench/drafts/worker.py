"""The draft recipe's heavy steps, run by the interpreter that has vLLM, torch, transformers
and speculators (a draft's ``python``; gridbench's own environment has none of them):

    python -m gridbench.drafts.worker respond ...        the target's own greedy answers (vLLM)
    python -m gridbench.drafts.worker hidden-states ...  its hidden states (transformers)
    python -m gridbench.drafts.worker train ...          speculators' trainer, CPU or GPU

Nothing here imports gridbench's dependencies (the interpreter may lack them). Each step
prints its StepFacts as one JSON line for the recipe's record.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gridbench.drafts.records import StepFacts

DTYPES = ("bfloat16", "float32")  # the recipe's dtype (config.schema.yaml)


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def respond(args: argparse.Namespace) -> StepFacts:
    """Greedy answers of the target to every prompt, kept as token ids: speculators' rows
    (input_ids, loss_mask over the answer) exactly as vLLM tokenized and generated them."""
    from vllm import LLM, SamplingParams

    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines()]
    llm = LLM(model=args.model, seed=args.seed, max_model_len=args.seq_length, **json.loads(args.llm_args))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, seed=args.seed)
    started = time.perf_counter()
    outputs = llm.chat([[{"role": "user", "content": p["text"]}] for p in prompts], params, use_tqdm=True)
    wall_s = time.perf_counter() - started
    rows, answer_tokens, truncated = [], 0, 0
    for prompt, output in zip(prompts, outputs, strict=True):
        answer = output.outputs[0]
        prompt_ids, answer_ids = list(output.prompt_token_ids), list(answer.token_ids)
        ids = (prompt_ids + answer_ids)[: args.seq_length]
        truncated += len(prompt_ids) + len(answer_ids) > args.seq_length
        answer_tokens += len(answer_ids)
        rows.append(
            {
                "id": prompt["id"],
                "prompt_class": prompt["prompt_class"],
                "finish_reason": answer.finish_reason,
                "answer": answer.text,
                "input_ids": ids,
                "loss_mask": ([0] * len(prompt_ids) + [1] * len(answer_ids))[: args.seq_length],
            }
        )
    with Path(args.out).open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return StepFacts(
        step="answers",
        wall_s=round(wall_s, 1),
        device=_device(),
        rows=len(rows),
        tokens=sum(len(r["input_ids"]) for r in rows),
        answer_tokens=answer_tokens,
        truncated_rows=truncated,
        ended_on_eos=sum(r["finish_reason"] == "stop" for r in rows),
    )


def hidden_states(args: argparse.Namespace) -> StepFacts:
    """hs_<i>.safetensors per row of the prepared dataset, in speculators' file format:
    token_ids [seq] and hidden_states [seq, len(layers) + 1, hidden] (in --dtype), the auxiliary
    layers numbered as vLLM numbers them (k: the residual stream entering decoder layer k) and
    last the final decoder layer's output before the final norm, which vLLM hands its drafts
    (transformers' last hidden state is after the norm, so a hook takes it)."""
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    _seed_everything(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = load_from_disk(args.data)
    dataset.set_format(type="torch")
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    model.to(torch.device(device))
    model.train(False)  # inference: no dropout
    layers = args.layers or _target_layers(model.config.num_hidden_layers)
    captured: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_pre_hook(lambda _module, inputs: captured.update(pre_norm=inputs[0]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started, tokens = time.perf_counter(), 0
    with torch.inference_mode():
        for i in range(len(dataset)):
            ids = dataset[i]["input_ids"].long()
            result = model.model(
                input_ids=ids.unsqueeze(0).to(device), output_hidden_states=True, use_cache=False
            )
            stack = [result.hidden_states[k][0] for k in layers] + [captured["pre_norm"][0]]
            states = torch.stack(stack, dim=1).to(dtype).cpu().contiguous()
            save_file(
                {"token_ids": ids.contiguous(), "hidden_states": states}, str(out / f"hs_{i}.safetensors")
            )
            tokens += ids.numel()
    return StepFacts(
        step="hidden-states",
        wall_s=round(time.perf_counter() - started, 1),
        device=_device(),
        rows=len(dataset),
        tokens=tokens,
        layers=(*layers, model.config.num_hidden_layers),
        dtype=args.dtype,
    )


def _target_layers(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]  # speculators' and vLLM's default, EAGLE-3's and DFlash's


def _patch_for_cpu() -> None:
    """speculators' trainer assumes an accelerator in three places (0.9.0): it moves the model
    to its local rank (cuda:0), autocasts for "cuda" and times steps with
    torch.accelerator.synchronize. Without an accelerator they become the CPU's."""
    import speculators.train.trainer as trainer
    import torch

    if torch.accelerator.is_available():
        return
    torch.accelerator.synchronize = lambda *_args, **_kwargs: None
    trainer.get_local_rank = lambda: "cpu"
    original_init = trainer.Trainer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = init


def _orthogonalise_in_float32() -> None:
    """Muon's Newton-Schulz orthogonalisation in float32. PyTorch runs it in bfloat16 whatever
    the parameters' dtype (torch 2.13: ``grad.bfloat16()``), which a CPU without bfloat16
    instructions emulates: 2.6 s where float32 takes 0.06 s for a 576 x 1536 update on AVX2
    kernels (benchmarks/cpu_bfloat16.py)."""
    import torch
    from torch.optim import _muon

    def newton_schulz(grad: Any, ns_coefficients: Any, ns_steps: int, eps: float) -> Any:
        a, b, c = ns_coefficients
        tall = grad.size(0) > grad.size(1)
        ortho = (grad.T if tall else grad).float()
        ortho = ortho / ortho.norm().clamp(min=eps)  # spectral norm at most 1
        for _ in range(ns_steps):
            gram = ortho @ ortho.T
            ortho = torch.addmm(ortho, torch.addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
        return ortho.T if tall else ortho

    _muon._zeropower_via_newtonschulz = newton_schulz


def _tee_metrics(path: Path) -> None:
    """Every metrics record the trainer logs, also as one JSON line (with seconds since the
    start) in ``path``: the loss curve the recipe keeps."""
    import speculators.train.trainer as trainer

    sink = path.open("w")
    started = time.perf_counter()
    log = trainer.metric_logger.info

    def info(message: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(message, dict):
            sink.write(
                json.dumps({"t_s": round(time.perf_counter() - started, 2), **message}, default=str) + "\n"
            )
            sink.flush()
        return log(message, *args, **kwargs)

    trainer.metric_logger.info = info


def _trainer_args(args: argparse.Namespace) -> list[str]:
    """speculators train's flags shared by the untrained and the trained head."""
    return [
        *("--speculator-type", args.method, "--verifier-name-or-path", args.model, "--data-path", args.data),
        *("--draft-vocab-size", str(args.draft_vocab_size), "--total-seq-len", str(args.total_seq_len)),
        *("--seed", str(args.seed), "--num-workers", "0", "--hidden-states-dtype", args.dtype),
        # the same kernels on a CPU and a GPU: the fused loss is a Triton kernel, and flex
        # attention needs torch.compile
        *("--loss-implementation", "eager", "--draft-attn-impl", "sdpa"),
        *(part for flag in ("num_layers", "block_size", "max_anchors") for part in _flag(args, flag)),
    ]


def _flag(args: argparse.Namespace, name: str) -> tuple[str, ...]:
    value = getattr(args, name)
    return () if value is None else (f"--{name.replace('_', '-')}", str(value))


def train(args: argparse.Namespace) -> StepFacts:
    """speculators' own trainer over the prepared data: an untrained head (its --dry-run, same
    config and seed) and the trained one, each copied as vLLM loads it (config.json and
    model.safetensors) to ``--head`` and ``--untrained-head``."""
    import torch
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    _patch_for_cpu()
    if args.dtype == "float32":
        _orthogonalise_in_float32()
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    common = _trainer_args(args)
    scratch = Path(args.scratch)
    shutil.rmtree(scratch, ignore_errors=True)  # a fresh start, never a resumed one
    main(TrainConfig.resolve([*common, "--dry-run", "--save-path", str(scratch / "untrained")]))
    _keep_head(scratch / "untrained", Path(args.untrained_head))
    _tee_metrics(Path(args.metrics))
    started = time.perf_counter()
    schedule = ["--epochs", str(args.epochs), "--lr", str(args.lr), "--log-freq", "1"]
    main(TrainConfig.resolve([*common, *schedule, "--save-path", str(scratch / "trained")]))
    wall_s = time.perf_counter() - started
    epochs = [p for p in (scratch / "trained").iterdir() if p.name.isdigit()]
    _keep_head(max(epochs, key=lambda p: int(p.name)), Path(args.head))
    shutil.rmtree(scratch)
    return StepFacts(
        step="train",
        wall_s=round(wall_s, 1),
        device=_device(),
        epochs=args.epochs,
        threads=threads,
        torch=torch.__version__,
        dtype=args.dtype,
    )


def _keep_head(checkpoint: Path, head: Path) -> None:
    head.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(checkpoint / name, head / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gridbench.drafts.worker", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("respond")
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--llm-args", default="{}", help="JSON keyword arguments of vllm.LLM")
    p.set_defaults(func=respond)
    p = sub.add_parser("hidden-states")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, nargs="*", default=[])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--dtype", choices=DTYPES, required=True)
    p.set_defaults(func=hidden_states)
    p = sub.add_parser("train")
    for name in ("--model", "--data", "--method", "--head", "--untrained-head", "--metrics", "--scratch"):
        p.add_argument(name, required=True)
    for name in ("--draft-vocab-size", "--total-seq-len", "--epochs", "--seed"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dtype", choices=DTYPES, required=True)
    for name in ("--num-layers", "--block-size", "--max-anchors"):  # speculators' default when absent
        p.add_argument(name, type=int)
    p.set_defaults(func=train)
    args = parser.parse_args(argv)
    facts = args.func(args)
    sys.stdout.write("RECIPE-STEP " + json.dumps(asdict(facts)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
