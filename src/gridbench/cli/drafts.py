"""`gridbench draft STEP`: one step of a draft head's recipe (workflow/rules/drafts.smk);
`gridbench draft export|import`: a trained draft carried to another machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gridbench import layout


def cmd_draft_step(args: argparse.Namespace) -> int:
    from gridbench.drafts.recipe import DraftPaths, read_recipe, run_step
    from gridbench.util import codec

    recipe = read_recipe(args.recipe)
    facts = run_step(recipe, DraftPaths.of(recipe), args.step)
    print(f"draft {recipe.name}, step {args.step}: {json.dumps(codec.to_json(facts))}")
    return 0


def cmd_draft_export(args: argparse.Namespace) -> int:
    from gridbench.drafts.carry import export_draft
    from gridbench.drafts.recipe import read_recipe

    manifest = export_draft(read_recipe(args.recipe), args.out)
    print(f"draft {manifest.draft}: {len(manifest.members)} files in {args.out}")
    return 0


def cmd_draft_import(args: argparse.Namespace) -> int:
    from gridbench.drafts.carry import import_draft, read_manifest

    if args.targets:  # what must be built before the import can check the head against it
        print("\n".join(read_manifest(args.archive).target_sha256))
        return 0
    print(import_draft(args.archive))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "draft", help="a draft head's recipe step by step (the config's drafts section), or its carry"
    )
    steps = p.add_subparsers(dest="draft_command", required=True)
    for step in layout.DRAFT_STEPS:
        s = steps.add_parser(step, help=f"the recipe's {step} step; each needs the one before it")
        s.add_argument(
            "--recipe", type=Path, required=True, help="a draft's recipe as JSON (written by the workflow)"
        )
        s.set_defaults(func=cmd_draft_step, step=step)
    s = steps.add_parser("export", help="a trained draft, less its hidden states, in one archive to carry")
    s.add_argument(
        "--recipe", type=Path, required=True, help="the draft's recipe (.gridbench/drafts/NAME.json)"
    )
    s.add_argument("--out", type=Path, required=True, help="the archive to write (.tar.gz)")
    s.set_defaults(func=cmd_draft_export)
    s = steps.add_parser(
        "import",
        help="a carried draft where the workflow finds it trained (after its target is built)",
    )
    s.add_argument("archive", type=Path, nargs="+", help="the archive, or its pieces in order")
    s.add_argument(
        "--targets",
        action="store_true",
        help="print the target's files the import checks, and import nothing",
    )
    s.set_defaults(func=cmd_draft_import)
