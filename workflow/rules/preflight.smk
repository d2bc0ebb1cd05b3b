rule check_engine:
    input:
        get_engine_files,
    output:
        layout.ENGINE_CHECK,
    log:
        "logs/preflight/{engine}.log",
    priority: ORDER.engine_check_priority
    params:
        grid=ENGINE_CHECK_GRID_FILE,
    shell:
        "gridbench engine check --grid {params.grid:q} --engine {wildcards.engine:q}"
        " --out {output:q} > {log:q} 2>&1"
