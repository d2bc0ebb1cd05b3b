"""The commands a person runs: the cells and progress of a sweep, the engines, the config
reference, comparing two studies and finishing a cut-short one."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gridbench.errors import GridbenchError

if TYPE_CHECKING:  # for annotations only: a cell's start-up should not import these
    from collections.abc import Callable

    from gridbench.config.grid import Grid

from gridbench.cli.common import add_configfile, grid_from_json, load_grid_args
from gridbench.cli.workflow import (
    grid_help,
    read_frame,
    write_depth_dataset,
    write_explorer_file,
    write_load_dataset,
    write_natural_dataset,
    write_quality_dataset,
    write_report,
    write_sessions_dataset,
)


def cmd_cells(args: argparse.Namespace) -> int:
    from gridbench.cells.plan import sweep_plan

    plan = sweep_plan(load_grid_args(args))
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

    grid = load_grid_args(args)
    if args.name not in grid.configs:
        raise GridbenchError(f"unknown config {args.name!r}; allowed values: {', '.join(grid.configs)}")
    print(describe_launch(grid.configs[args.name]))
    return 0


def cmd_engine_check(args: argparse.Namespace) -> int:
    from gridbench.engines.preflight import check_engine
    from gridbench.util import codec
    from gridbench.util.files import atomic_write_json

    grid = grid_from_json(args.grid)
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


def cmd_progress(args: argparse.Namespace) -> int:
    import time

    from gridbench.cells.progress import WorkdirReader, planned_cells, progress_line, progress_panel

    reader = WorkdirReader(planned_cells(load_grid_args(args)))
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


def _study_dataset(folder: Path) -> Path:
    """A study's depth dataset, given the study folder or its dataset/ folder."""
    for candidate in (folder / "dataset/dataset.parquet", folder / "dataset.parquet"):
        if candidate.is_file():
            return candidate
    raise GridbenchError(
        f"{folder}: no dataset/dataset.parquet in it",
        hint="name a study folder (or its dataset/) that a sweep finished",
    )


REGRESSION_EXIT = 3


def cmd_compare(args: argparse.Namespace) -> int:
    from gridbench import layout
    from gridbench.aggregate.compare import (
        compare_quality,
        compare_studies,
        render_comparison,
        write_ratio_graphs,
    )
    from gridbench.util.files import atomic_write_text

    before_name = args.before_name or args.before.resolve().name
    after_name = args.after_name or args.after.resolve().name
    if before_name == after_name:
        before_name, after_name = "before", "after"
    before, after = _study_dataset(args.before), _study_dataset(args.after)
    quality_before, quality_after = (p.with_name(Path(layout.QUALITY_PARQUET).name) for p in (before, after))
    quality = None
    if quality_before.is_file() and quality_after.is_file():
        quality = compare_quality(
            read_frame(quality_before), read_frame(quality_after), args.quality_threshold, args.kl_threshold
        )
    comparison = compare_studies(read_frame(before), read_frame(after), args.threshold, quality)
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
    for further in comparison.quality_regressions:
        print(
            f"REGRESSION {further.config} quality: {further.before.match_pct:.1f} -> "
            f"{further.after.match_pct:.1f} % of {further.after.unit} match {further.after.reference}'s"
            + (f", KL {further.kl_rise:+.4f} nats/token" if further.kl_rise is not None else "")
            + (", no longer lossless" if further.lost_losslessness else "")
        )
    return REGRESSION_EXIT if comparison.regressed else 0


def cmd_finalize(args: argparse.Namespace) -> int:
    """Dataset, graphs and report from whatever cells exist (the workflow's end, also on error):
    the aggregate rules' steps, in one process."""
    from gridbench import layout
    from gridbench.aggregate import plots
    from gridbench.aggregate.ledger import event_files_here

    grid = grid_from_json(args.grid)
    root = args.outdir
    depth = write_depth_dataset(
        grid, root / layout.DATASET_CSV, root / layout.DATASET_JSON, root / layout.DATASET_PARQUET
    )
    figures = plots.depth_figures(depth, grid.study)
    natural = None
    if grid.natural:
        natural = write_natural_dataset(grid, root / layout.NATURAL_CSV, root / layout.NATURAL_PARQUET)
        figures.update(plots.natural_figures(natural))
    quality = None
    if grid.quality:
        quality = write_quality_dataset(grid, root / layout.QUALITY_CSV, root / layout.QUALITY_PARQUET)
        figures.update(plots.quality_figures(quality, depth))
    load = None
    if grid.load:
        load = write_load_dataset(grid, root / layout.LOAD_CSV, root / layout.LOAD_PARQUET)
        figures.update(plots.load_figures(load))
    sessions = None
    if grid.sessions:
        sessions = write_sessions_dataset(grid, root / layout.SESSIONS_CSV, root / layout.SESSIONS_PARQUET)
        figures.update(plots.session_figures(sessions))
    graphs = plots.save(figures, root / Path(layout.GRAPH).parent)
    print(f"wrote {len(graphs)} graphs to {root / Path(layout.GRAPH).parent}")
    write_report(
        grid, depth, natural, graphs, root / layout.REPORT, quality, event_files_here(), load, sessions
    )
    write_explorer_file(root / layout.EXPLORER, depth, natural, grid, quality)
    return 0


def _load_probe(grid: Grid, config: str, at: dict[str, str], slots: list[str]) -> Callable[[float], bool]:
    """Whether the config's load cell at a rate met the SLO, measured through the cell runner
    unless its raw file is there."""
    from gridbench.cells.context import cell_from_grid
    from gridbench.cells.kinds.load import LOAD
    from gridbench.cells.run import run_cell
    from gridbench.cells.search import probe_outcome
    from gridbench.harness.arrivals import rate_name

    def outcome(rate: float) -> bool:
        where = {**at, "rate": rate_name(rate)}
        files = LOAD.patterns.files(config=config, **where)
        outputs = {"raw": Path(files.raw), "provenance": Path(files.provenance)}
        cell = cell_from_grid(grid, "load", config, slots, **where)
        slo = grid.load.slo if grid.load else None
        return slo is not None and probe_outcome(outputs["raw"], slo, lambda: run_cell(cell, outputs))

    return outcome


def _rate_text(rate: float | None) -> str:
    return "no rate measured" if rate is None else f"{rate:g} req/s"


def cmd_load_trace(args: argparse.Namespace) -> int:
    """A generated trace (harness/trace.TraceShape: bursty gamma arrivals, lognormal lengths)."""
    from gridbench.harness.trace import format_trace, generate_trace
    from gridbench.util.files import atomic_write_text

    if args.requests < 2 or args.rate <= 0:
        raise GridbenchError("load-trace: --requests must be at least 2 and --rate above 0")
    entries = generate_trace(args.requests, args.rate, args.seed)
    atomic_write_text(args.out, format_trace(entries, csv_format=args.out.suffix == ".csv"))
    print(f"wrote {args.out}: {len(entries)} requests over {entries[-1].offset_s:.1f} s")
    return 0


def cmd_load_search(args: argparse.Namespace) -> int:
    """Per config, prompt class and arrival process: the load section's rates, then the
    capacity search's bisecting ones, each an ordinary load cell through the cell runner
    (its raw file read instead when present, so a stopped search resumes)."""
    from gridbench import layout
    from gridbench.cells.search import search_capacity
    from gridbench.engines.manager import detect_gpus

    grid = load_grid_args(args)
    if grid.load is None:
        raise GridbenchError(f"{grid.source}: no load section, so no capacity search")
    load, slots = grid.load, [str(s) for s in grid.gpu_slots or detect_gpus()] or ["cpu"]
    for config in grid.selected():
        for prompt_class in load.prompt_classes:
            for arrival in load.arrivals:
                at = {"prompt_class": prompt_class, "arrival": arrival.name}
                found = search_capacity(load.rates, load.search, _load_probe(grid, config.name, at, slots))
                low, high = (
                    _rate_text(r) for r in (found.bracket.passing_req_s, found.bracket.failing_req_s)
                )
                print(
                    f"capacity search: {config.name} {prompt_class} {arrival.name}: meets the SLO at "
                    f"{low}, misses it at {high} after {found.probes} added rates "
                    f"({'converged' if found.converged else 'not converged'})"
                )
    # the dataset with the added rates; the next snakemake run renders the report from it
    write_load_dataset(grid, Path(layout.LOAD_CSV), Path(layout.LOAD_PARQUET))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "load-search",
        help="the load section's rates, then load cells bisecting each config's capacity under the SLO",
    )
    add_configfile(p)
    p.set_defaults(func=cmd_load_search)

    p = sub.add_parser(
        "load-trace",
        help="write a load trace (arrivals, input and output lengths) shaped like production traces",
    )
    p.add_argument(
        "--out", required=True, type=Path, help="the trace file: CSV when it ends in .csv, else JSON Lines"
    )
    p.add_argument("--requests", required=True, type=int, metavar="N", help="requests in the trace")
    p.add_argument("--rate", required=True, type=float, metavar="R", help="mean arrivals per second")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the draw's seed (default: 0)")
    p.set_defaults(func=cmd_load_trace)

    p = sub.add_parser("cells", help="list the cells a config schedules, and those it skips")
    add_configfile(p)
    p.set_defaults(func=cmd_cells)

    p = sub.add_parser(
        "progress",
        help="where a sweep in this directory stands: cells done, ETA, what the running cells do",
    )
    add_configfile(p)
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
    add_configfile(p)
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
    p.add_argument(
        "--quality-threshold",
        type=float,
        default=5.0,
        metavar="PP",
        help="where both studies have dataset/quality.parquet: a config whose greedy output matches "
        "its reference's in fewer positions by more than PP percentage points regresses (5)",
    )
    p.add_argument(
        "--kl-threshold",
        type=float,
        default=0.01,
        metavar="NATS",
        help="where both studies made the teacher-forced pass: a config whose KL divergence from its "
        "reference rose by more than NATS per token regresses (0.01)",
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
