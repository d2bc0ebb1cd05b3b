"""The commands the workflow's rules call: one cell, a dataset, the graphs, the report and the
explorer. Their command lines are what Snakemake hashes to decide a rerun: keep them as they are."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gridbench.errors import GridbenchError

if TYPE_CHECKING:  # for annotations only: a cell's start-up should not import these
    import pandas as pd

    from gridbench.config.grid import Grid

from gridbench.cli.common import grid_from_json

grid_help = "the validated grid config as JSON (written by the workflow)"


# `bench` and `natural` are the first kinds' own commands: their rules' command lines, which
# Snakemake hashes to decide a rerun, stay as they were; a kind added later uses `cell`.
def cmd_bench(args: argparse.Namespace) -> int:
    from gridbench.cells.kinds import cell_kind
    from gridbench.cells.run import run_cell

    kind = cell_kind("benchy-cached" if args.prefix_cache else "benchy")
    cell = kind.load(args.context, {"depth": str(args.depth)})
    return run_cell(cell, {"raw": args.raw, "provenance": args.provenance})


def cmd_cell(args: argparse.Namespace) -> int:
    """One cell of any registered kind, its coordinates given as its rule's wildcards."""
    from gridbench.cells.kinds import CELL_KINDS
    from gridbench.cells.run import run_cell

    kind = CELL_KINDS.get(args.kind)
    if kind is None:
        raise GridbenchError(f"unknown cell kind {args.kind!r}; allowed values: {', '.join(CELL_KINDS)}")
    wildcards = dict(item.partition("=")[::2] for item in args.at)
    if sorted(wildcards) != sorted(kind.wildcard_names):
        raise GridbenchError(
            f"cell kind {kind.name}: --at gives {', '.join(wildcards) or 'nothing'}; "
            f"expected {', '.join(f'{name}=VALUE' for name in kind.wildcard_names)}"
        )
    return run_cell(kind.load(args.context, wildcards), {"raw": args.raw, "provenance": args.provenance})


def cmd_natural(args: argparse.Namespace) -> int:
    from gridbench.cells.kinds import cell_kind
    from gridbench.cells.run import run_cell

    wildcards = {"prompt_class": args.prompt_class, "concurrency": str(args.concurrency)}
    cell = cell_kind("natural").load(args.context, wildcards)
    return run_cell(cell, {"raw": args.out, "provenance": args.provenance})


def write_depth_dataset(grid: Grid, csv: Path, json_path: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.dataset import build_from_plan
    from gridbench.cells.plan import depth_plan

    frame = build_from_plan(depth_plan(grid), csv=csv, json_path=json_path, parquet=parquet)
    print_counts("depth", frame, [csv, json_path, parquet])
    return frame


def cmd_dataset(args: argparse.Namespace) -> int:
    write_depth_dataset(grid_from_json(args.grid), args.csv, args.json, args.parquet)
    return 0


def print_counts(kind: str, frame: pd.DataFrame, paths: Sequence[Path]) -> None:
    counts = frame["status"].value_counts()
    summary = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "failed", "skipped"))
    print(f"wrote {len(frame)} {kind} rows ({summary}) to {', '.join(map(str, paths))}")
    if counts.get("failed", 0):
        print(f"PARTIAL: {counts['failed']} {kind} cells failed; their rows carry the reason")


def write_natural_dataset(grid: Grid, csv: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.natural import build_from_plan
    from gridbench.cells.plan import natural_plan

    frame = build_from_plan(natural_plan(grid), csv=csv, parquet=parquet)
    print_counts("natural-prompt", frame, [csv, parquet])
    return frame


def cmd_natural_dataset(args: argparse.Namespace) -> int:
    write_natural_dataset(grid_from_json(args.grid), args.csv, args.parquet)
    return 0


def write_quality_dataset(grid: Grid, csv: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.quality import build_from_plan
    from gridbench.cells.plan import quality_plan

    frame = build_from_plan(quality_plan(grid), csv=csv, parquet=parquet)
    print_counts("quality", frame, [csv, parquet])
    mismatched = frame[frame["lossless_mismatches"].fillna(0) > 0]
    for row in mismatched.itertuples():
        print(
            f"NOT LOSSLESS: {row.config}'s greedy outputs differ from its baseline {row.baseline}'s for "
            f"{row.lossless_mismatches} of {row.lossless_prompts} prompts "
            f"({row.lossless_mismatched_classes}: prompt class@first differing position)"
        )
    return frame


def cmd_quality_dataset(args: argparse.Namespace) -> int:
    write_quality_dataset(grid_from_json(args.grid), args.csv, args.parquet)
    return 0


def write_load_dataset(grid: Grid, csv: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.load import build_from_plan
    from gridbench.cells.plan import load_plan

    frame, capacities = build_from_plan(load_plan(grid, searched=True), csv=csv, parquet=parquet)
    print_counts("load", frame, [csv, parquet])
    for found in capacities:
        where = f"{found.config} {found.prompt_class} {found.arrival}"
        if found.capacity_req_s is None:
            print(f"capacity: {where}: no measured rate met the SLO")
            continue
        failing = found.first_failing_req_s
        print(
            f"capacity: {where}: {found.capacity_req_s:g} req/s meets the SLO "
            f"({found.goodput_tok_s} goodput tok/s, {found.binding_constraint} binding); first failing "
            f"rate: {'none measured' if failing is None else f'{failing:g} req/s'}"
        )
    return frame


def cmd_load_dataset(args: argparse.Namespace) -> int:
    write_load_dataset(grid_from_json(args.grid), args.csv, args.parquet)
    return 0


def write_sessions_dataset(grid: Grid, csv: Path, parquet: Path) -> pd.DataFrame:
    from gridbench.aggregate.sessions import build_from_plan
    from gridbench.cells.plan import session_plan

    frame = build_from_plan(session_plan(grid), csv=csv, parquet=parquet)
    print_counts("session-turn", frame, [csv, parquet])
    return frame


def cmd_sessions_dataset(args: argparse.Namespace) -> int:
    write_sessions_dataset(grid_from_json(args.grid), args.csv, args.parquet)
    return 0


def read_frame(path: Path) -> pd.DataFrame:
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
        figures = plots.depth_figures(read_frame(args.dataset), grid_from_json(args.grid).study)
    elif args.matrix == "quality":
        if args.quality is None:
            raise GridbenchError("gridbench plot quality: --quality is required (dataset/quality.parquet)")
        figures = plots.quality_figures(read_frame(args.quality), read_frame(args.dataset))
    elif args.matrix == "load":
        figures = plots.load_figures(read_frame(args.dataset))
    elif args.matrix == "sessions":
        figures = plots.session_figures(read_frame(args.dataset))
    else:
        figures = plots.natural_figures(read_frame(args.dataset))
    for path in plots.save(figures, args.outdir):
        print(f"wrote {path}")
    return 0


def _warn_checks(
    grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None, quality: pd.DataFrame | None
) -> None:
    """Each anomaly check that triggers, in the run's log as well as in the report's Checks."""
    from gridbench.aggregate.checks import run_checks

    for check in run_checks(dataset, natural, grid.study, quality):
        if check.triggered:
            print(f"gridbench: warning: {check.summary}", file=sys.stderr)


def write_report(
    grid: Grid,
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None,
    graphs: Sequence[Path],
    out: Path,
    quality: pd.DataFrame | None = None,
    events: Sequence[Path] | None = None,
    load: pd.DataFrame | None = None,
    sessions: pd.DataFrame | None = None,
) -> None:
    """comparison.md; ``events`` (engine events files) add the GPU time ledger and, from the
    engine logs beside them, the acceptance's cross-check; ``load`` (the load dataset) the
    capacity under the SLO, ``sessions`` (the sessions dataset) TTFT and the prefix cache by turn."""
    from gridbench.aggregate.ledger import read_ledger
    from gridbench.aggregate.report import is_partial, render_report
    from gridbench.aggregate.report.appendix import kind_outcomes
    from gridbench.aggregate.spec_log import read_engine_runs
    from gridbench.util.files import atomic_write_text

    links = [Path(os.path.relpath(g, out.parent)).as_posix() for g in graphs]
    ledger = read_ledger(grid, events) if events is not None else None
    runs = read_engine_runs(events) if events is not None else []
    text = render_report(grid, dataset, natural, links, quality, ledger, load, sessions, engine_runs=runs)
    atomic_write_text(out, text)
    _warn_checks(grid, dataset, natural, quality)
    partial = is_partial(kind_outcomes(dataset, natural, quality, load, sessions))
    print(f"wrote {out}{' (PARTIAL: some cells failed)' if partial else ''}")


def cmd_report(args: argparse.Namespace) -> int:
    natural = read_frame(args.natural) if args.natural else None
    quality = read_frame(args.quality) if args.quality else None
    load = read_frame(args.load) if args.load else None
    sessions = read_frame(args.sessions) if args.sessions else None
    grid = grid_from_json(args.grid)
    events = args.events or None
    write_report(
        grid, read_frame(args.dataset), natural, args.graphs, args.out, quality, events, load, sessions
    )
    return 0


def write_explorer_file(
    out: Path,
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None,
    grid: Grid | None,
    quality: pd.DataFrame | None = None,
) -> None:
    from gridbench.aggregate.explorer import write_explorer
    from gridbench.aggregate.weights_origin import config_origins
    from gridbench.config.grid import StudyInfo

    # a study copied back without its grid file still gets an explorer: baselines are then
    # inferred, and no config declares its weights' origin
    study, origins = (StudyInfo(), None) if grid is None else (grid.study, config_origins(grid))
    data = write_explorer(out, dataset, natural, study, origins, quality)
    cells = len(data.depth) + len(data.natural)
    print(f"wrote {out} ({len(data.configs)} configs, {cells} measured cells)")


def cmd_explorer(args: argparse.Namespace) -> int:
    natural = read_frame(args.natural) if args.natural else None
    quality = read_frame(args.quality) if args.quality else None
    grid = grid_from_json(args.grid) if args.grid else None
    write_explorer_file(args.out, read_frame(args.dataset), natural, grid, quality)
    return 0


# a regression is not a failure to run: CI can tell the two apart


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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

    p = sub.add_parser(
        "cell", help="run one cell of any registered kind (called by the workflow's rule of the kind)"
    )
    p.add_argument("--kind", required=True, help="the registered kind (gridbench.cells.kinds)")
    p.add_argument("--context", required=True, type=Path, help="the config's cell context (JSON)")
    p.add_argument(
        "--at",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="the cell's coordinates: its rule's wildcards",
    )
    p.add_argument("--raw", required=True, type=Path, help="the cell's raw result")
    p.add_argument("--provenance", required=True, type=Path)
    p.set_defaults(func=cmd_cell)

    p = sub.add_parser("natural", help="run one natural-prompt cell (called by the workflow)")
    p.add_argument("--context", required=True, type=Path, help="the config's cell context (JSON)")
    p.add_argument("--prompt-class", required=True)
    p.add_argument("--concurrency", required=True, type=int)
    p.add_argument("--out", required=True, type=Path, help="the cell's raw result JSON")
    p.add_argument("--provenance", required=True, type=Path)
    p.set_defaults(func=cmd_natural)

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

    p = sub.add_parser(
        "quality-dataset",
        help="compare the quality cells' greedy outputs (reference, baseline) into dataset/quality.*",
    )
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--csv", required=True, type=Path)
    p.add_argument("--parquet", required=True, type=Path)
    p.set_defaults(func=cmd_quality_dataset)

    p = sub.add_parser(
        "load-dataset", help="judge the load cells by the SLO into dataset/load.*, and each config's capacity"
    )
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--csv", required=True, type=Path)
    p.add_argument("--parquet", required=True, type=Path)
    p.set_defaults(func=cmd_load_dataset)

    p = sub.add_parser("sessions-dataset", help="aggregate the session cells' turns into dataset/sessions.*")
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--csv", required=True, type=Path)
    p.add_argument("--parquet", required=True, type=Path)
    p.set_defaults(func=cmd_sessions_dataset)

    p = sub.add_parser("plot", help="draw the graphs of one matrix from its dataset (PNG)")
    p.add_argument(
        "matrix",
        choices=["depth", "natural", "quality", "load", "sessions"],
        help="depth: dataset.parquet; natural: natural.parquet; quality: --quality beside dataset.parquet;"
        " load: load.parquet; sessions: sessions.parquet",
    )
    p.add_argument("--dataset", required=True, type=Path, help="the matrix's Parquet dataset")
    p.add_argument("--grid", type=Path, help=f"{grid_help}; depth graphs need it for the baselines")
    p.add_argument("--quality", type=Path, help="the quality graph's dataset/quality.parquet")
    p.add_argument("--outdir", required=True, type=Path)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="render comparison.md from the datasets and graphs")
    p.add_argument("--grid", required=True, type=Path, help=grid_help)
    p.add_argument("--dataset", required=True, type=Path, help="dataset/dataset.parquet")
    p.add_argument("--natural", type=Path, help="dataset/natural.parquet, when the study has one")
    p.add_argument("--quality", type=Path, help="dataset/quality.parquet, when the study has one")
    p.add_argument("--load", type=Path, help="dataset/load.parquet, when the study has a load section")
    p.add_argument(
        "--sessions", type=Path, help="dataset/sessions.parquet, when the study has a sessions section"
    )
    p.add_argument("--graphs", nargs="*", default=[], type=Path, help="PNG files to embed, in order")
    p.add_argument(
        "--events",
        action="append",
        type=Path,
        help="an engine events file (logs/engines/events.jsonl; repeat for several): adds the "
        "GPU time ledger (a file that does not exist holds no events) and, from the engine logs "
        "beside it, the acceptance's cross-check against vLLM's log",
    )
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "explorer", help="write the interactive explorer (one offline HTML file) from the datasets"
    )
    p.add_argument("--dataset", required=True, type=Path, help="dataset/dataset.parquet")
    p.add_argument("--natural", type=Path, help="dataset/natural.parquet, when the study has one")
    p.add_argument("--quality", type=Path, help="dataset/quality.parquet, when the study has one")
    p.add_argument(
        "--grid",
        type=Path,
        help=f"{grid_help}: names the baselines (else inferred) and each config's weights origin "
        "(else undeclared)",
    )
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=cmd_explorer)
