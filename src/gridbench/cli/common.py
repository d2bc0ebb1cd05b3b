"""What the commands share: the config options and loading the grid they name."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gridbench.errors import GridbenchError

if TYPE_CHECKING:  # for annotations only: a cell's start-up should not import these
    from gridbench.config.grid import Grid


def add_configfile(parser: argparse.ArgumentParser) -> None:
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


def load_grid_args(args: argparse.Namespace) -> Grid:
    import yaml

    from gridbench.config.loading import load_grid_files

    overrides = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            raise GridbenchError(f"--config {item}: expected KEY=VALUE")
        overrides[key] = yaml.safe_load(value) if value else ""  # `engine=` is an empty filter
    return load_grid_files(args.configfile, overrides)


def grid_from_json(path: Path) -> Grid:
    from gridbench.config.loading import load_grid_json

    return load_grid_json(Path(path))
