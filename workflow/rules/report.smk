# Graphs and comparison.md from the datasets; every output is registered for
# `snakemake --report report.html`.


rule plot_depth_graphs:
    input:
        layout.DATASET_PARQUET,
    output:
        report(
            "graphs/decode_vs_context.png",
            caption="../report/decode_vs_context.rst",
            category="Graphs",
            subcategory="Context depth",
        ),
        report(
            "graphs/ttft_vs_context.png",
            caption="../report/ttft_vs_context.rst",
            category="Graphs",
            subcategory="Context depth",
        ),
        report(
            "graphs/prefill_vs_context.png",
            caption="../report/prefill_vs_context.rst",
            category="Graphs",
            subcategory="Context depth",
        ),
        report(
            "graphs/decode_grouped.png",
            caption="../report/decode_grouped.rst",
            category="Graphs",
            subcategory="Context depth",
        ),
        report(
            "graphs/ttft_grouped.png",
            caption="../report/ttft_grouped.rst",
            category="Graphs",
            subcategory="Context depth",
        ),
        report(
            "graphs/ttft_cached_vs_context.png",
            caption="../report/ttft_cached_vs_context.rst",
            category="Graphs",
            subcategory="Context depth",
        ),
        report(
            "graphs/speedup_vs_context.png",
            caption="../report/speedup_vs_context.rst",
            category="Graphs",
            subcategory="Speedup and acceptance",
        ),
        report(
            "graphs/acceptance_per_position.png",
            caption="../report/acceptance_per_position.rst",
            category="Graphs",
            subcategory="Speedup and acceptance",
        ),
    log:
        "logs/graphs/depth.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench plot depth --grid {params.grid:q} --dataset {input:q} --outdir graphs > {log:q} 2>&1"


rule plot_natural_graphs:
    input:
        layout.NATURAL_PARQUET,
    output:
        report(
            "graphs/natural_tok_s_vs_concurrency.png",
            caption="../report/natural_tok_s_vs_concurrency.rst",
            category="Graphs",
            subcategory="Natural prompts",
        ),
        report(
            "graphs/natural_ttft_vs_concurrency.png",
            caption="../report/natural_ttft_vs_concurrency.rst",
            category="Graphs",
            subcategory="Natural prompts",
        ),
        report(
            "graphs/natural_tpot_vs_concurrency.png",
            caption="../report/natural_tpot_vs_concurrency.rst",
            category="Graphs",
            subcategory="Natural prompts",
        ),
        report(
            "graphs/natural_pareto.png",
            caption="../report/natural_pareto.rst",
            category="Graphs",
            subcategory="Natural prompts",
        ),
    log:
        "logs/graphs/natural.log",
    shell:
        "gridbench plot natural --dataset {input:q} --outdir graphs > {log:q} 2>&1"


rule plot_quality_graph:
    input:
        dataset=layout.DATASET_PARQUET,
        quality=layout.QUALITY_PARQUET,
    output:
        report(
            "graphs/quality_frontier.png",
            caption="../report/quality_frontier.rst",
            category="Graphs",
            subcategory="Quality",
        ),
    log:
        "logs/graphs/quality.log",
    shell:
        "gridbench plot quality --dataset {input.dataset:q} --quality {input.quality:q}"
        " --outdir graphs > {log:q} 2>&1"


rule plot_load_graph:
    input:
        layout.LOAD_PARQUET,
    output:
        report(
            "graphs/load_slo_vs_rate.png",
            caption="../report/load_slo_vs_rate.rst",
            category="Graphs",
            subcategory="Load",
        ),
    log:
        "logs/graphs/load.log",
    shell:
        "gridbench plot load --dataset {input:q} --outdir graphs > {log:q} 2>&1"


rule plot_session_graph:
    input:
        layout.SESSIONS_PARQUET,
    output:
        report(
            "graphs/session_ttft_by_turn.png",
            caption="../report/session_ttft_by_turn.rst",
            category="Graphs",
            subcategory="Sessions",
        ),
    log:
        "logs/graphs/sessions.log",
    shell:
        "gridbench plot sessions --dataset {input:q} --outdir graphs > {log:q} 2>&1"


rule render_report:
    input:
        unpack(get_report_inputs),
    output:
        report(
            layout.REPORT,
            caption="../report/comparison.rst",
            category="Report",
        ),
    log:
        "logs/report/render_report.log",
    params:
        grid=GRID_FILE,
        datasets=get_report_dataset_options,
        events=layout.ENGINE_EVENTS,
    shell:
        "gridbench report --grid {params.grid:q} --dataset {input.dataset:q} {params.datasets}"
        " --events {params.events:q} --graphs {input.graphs:q} --out {output:q} > {log:q} 2>&1"


rule render_explorer:
    input:
        unpack(get_explorer_inputs),
    output:
        report(
            layout.EXPLORER,
            caption="../report/explorer.rst",
            category="Report",
        ),
    log:
        "logs/report/render_explorer.log",
    params:
        grid=GRID_FILE,
        datasets=get_explorer_dataset_options,
    shell:
        "gridbench explorer --grid {params.grid:q} --dataset {input.dataset:q} {params.datasets}"
        " --out {output:q} > {log:q} 2>&1"
