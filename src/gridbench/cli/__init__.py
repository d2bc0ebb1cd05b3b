"""The ``gridbench`` command line: what the workflow's rules call, and what users run by hand.

Imports stay inside the subcommands so that a cell's start-up costs little.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from gridbench.cli import assets, drafts, user, workflow
from gridbench.errors import GridbenchError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gridbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    user.add_commands(sub)
    workflow.add_commands(sub)
    assets.add_commands(sub)
    drafts.add_commands(sub)
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
