"""Where a sweep's files go, relative to the working directory.

The workflow's rules spell the same patterns literally; tests/test_workflow_layout.py
keeps the two in step.
"""

from __future__ import annotations

RAW = "results/raw/{config}/depth_{depth}.json"
PROVENANCE = "results/raw/{config}/depth_{depth}.provenance.json"
FAILURE = "results/failures/{config}/depth_{depth}.json"
CELL_LOG = "logs/cells/{config}/depth_{depth}.log"
NATURAL = "results/natural/{config}/{prompt_class}_c{concurrency}.json"
NATURAL_PROVENANCE = "results/natural/{config}/{prompt_class}_c{concurrency}.provenance.json"
NATURAL_FAILURE = "results/failures/natural/{config}/{prompt_class}_c{concurrency}.json"
NATURAL_LOG = "logs/cells/{config}/natural_{prompt_class}_c{concurrency}.log"
DATASET_CSV = "dataset/dataset.csv"
DATASET_JSON = "dataset/dataset.json"
DATASET_PARQUET = "dataset/dataset.parquet"
