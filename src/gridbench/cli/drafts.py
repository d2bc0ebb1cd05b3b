"""`gridbench draft STEP`: one step of a draft head's recipe (workflow/rules/drafts.smk)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gridbench import layout


def cmd_draft(args: argparse.Namespace) -> int:
    from gridbench.drafts.recipe import DraftPaths, read_recipe, run_step
    from gridbench.util import codec

    recipe = read_recipe(args.recipe)
    facts = run_step(recipe, DraftPaths.of(recipe), args.step)
    print(f"draft {recipe.name}, step {args.step}: {json.dumps(codec.to_json(facts))}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("draft", help="one step of training a draft head (the config's drafts section)")
    p.add_argument("step", choices=layout.DRAFT_STEPS, help="the recipe's step; each needs the one before it")
    p.add_argument(
        "--recipe", type=Path, required=True, help="a draft's recipe as JSON (written by the workflow)"
    )
    p.set_defaults(func=cmd_draft)
