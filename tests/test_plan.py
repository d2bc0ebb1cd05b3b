"""The plan: which cells a grid runs, in which order, which are skipped and why, and the
prefix-cache pass's cells."""

from __future__ import annotations

from conftest import REPO, load_yaml
from gridbench.cells.kinds import CELL_KINDS
from gridbench.cells.plan import depth_plan, natural_plan
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid, load_grid_files


def seed_grid(**overrides) -> Grid:
    return load_grid_files([REPO / "config/config.yaml"], overrides)


def test_cells_and_filters():
    plan = depth_plan(seed_grid())
    assert len(plan.cells) == 126 and not plan.skipped
    assert len(depth_plan(seed_grid(engine="aeon")).cells) == 70
    assert {c.config for c in depth_plan(seed_grid(checkpoint="nvfp4")).cells} == {
        "Q_nvfp4_stock_n0",
        "Q_nvfp4_eugr_n0",
        "Q_nvfp4_aeon_n0",
        "Q_nvfp4_dfl8",
    }
    assert len(depth_plan(seed_grid(config="Q_bf16_dfl1,Q_bf16_dfl8")).cells) == 28
    assert len(depth_plan(seed_grid(speculation="dfl8")).cells) == 28


def test_depth_cells_run_config_major_in_declared_order_with_their_files():
    grid = seed_grid()
    plan = depth_plan(grid)
    assert [c.key for c in plan.cells] == [(c, d) for c in grid.configs for d in grid.depths]
    assert list(plan.configs) == list(grid.configs)
    benchy = CELL_KINDS["benchy"].patterns
    assert all(c.files == benchy.files(config=c.config, depth=c.depth) for c in plan.cells)


def test_cells_longer_than_max_model_len_are_skipped_with_the_reason():
    plan = depth_plan(seed_grid(serving={"max_model_len": 20000}))
    assert len(plan.cells) == 9 * 10
    assert {s.cell.depth for s in plan.skipped} == {24576, 32768, 49152, 65536}
    assert plan.skipped[0].reason == "depth 24576 + pp 512 + tg 256 = 25344 exceeds max_model_len 20000"


def test_the_prefix_cache_pass_has_a_cell_per_depth_with_context():
    grid = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml")
    cached = depth_plan(grid).cached_cells
    assert [c.key for c in cached] == [("D_q8_0_n0", d) for d in (256, 512, 1024)]
    cached_files = CELL_KINDS["benchy-cached"].patterns
    assert all(c.files == cached_files.files(config=c.config, depth=c.depth) for c in cached)


def test_natural_cells_run_by_config_then_prompt_class_then_concurrency():
    grid = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml")
    assert grid.natural is not None
    assert [c.key for c in natural_plan(grid).cells] == [
        (config, prompt_class, concurrency)
        for config in grid.configs
        for prompt_class in grid.natural.prompt_classes
        for concurrency in grid.natural.concurrency
    ]
