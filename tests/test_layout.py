"""The rules spell the output layout literally; these patterns must be layout.py's."""

from __future__ import annotations

import pytest

from conftest import REPO
from gridbench import layout

RULES = REPO / "workflow/rules"


@pytest.mark.parametrize(
    ("rules", "patterns"),
    [
        ("bench.smk", (layout.RAW, layout.PROVENANCE, layout.CELL_LOG)),
        ("natural.smk", (layout.NATURAL, layout.NATURAL_PROVENANCE, layout.NATURAL_LOG)),
        ("dataset.smk", (layout.DATASET_CSV, layout.DATASET_JSON, layout.DATASET_PARQUET)),
        ("dataset.smk", (layout.NATURAL_CSV, layout.NATURAL_PARQUET)),
        ("report.smk", (layout.REPORT, layout.EXPLORER)),
    ],
)
def test_the_rules_write_where_layout_says(rules, patterns):
    text = (RULES / rules).read_text()
    for pattern in patterns:
        assert f'"{pattern}"' in text, f"{rules} does not spell {pattern}"
