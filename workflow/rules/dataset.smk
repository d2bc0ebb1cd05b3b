rule build_dataset:
    input:
        get_raw_results,
    output:
        csv=report(
            layout.DATASET_CSV,
            caption="../report/dataset.rst",
            category="Dataset",
        ),
        json=layout.DATASET_JSON,
        parquet=layout.DATASET_PARQUET,
    log:
        "logs/dataset/build_dataset.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --json {output.json:q} --parquet {output.parquet:q}"
        " > {log:q} 2>&1"


rule build_natural_dataset:
    input:
        get_natural_results,
    output:
        csv=report(
            layout.NATURAL_CSV,
            caption="../report/natural_dataset.rst",
            category="Dataset",
        ),
        parquet=layout.NATURAL_PARQUET,
    log:
        "logs/dataset/build_natural_dataset.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench natural-dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --parquet {output.parquet:q} > {log:q} 2>&1"


rule build_load_dataset:
    input:
        get_load_results,
    output:
        csv=layout.LOAD_CSV,
        parquet=layout.LOAD_PARQUET,
    log:
        "logs/dataset/build_load_dataset.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench load-dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --parquet {output.parquet:q} > {log:q} 2>&1"


rule build_sessions_dataset:
    input:
        get_session_results,
    output:
        csv=layout.SESSIONS_CSV,
        parquet=layout.SESSIONS_PARQUET,
    log:
        "logs/dataset/build_sessions_dataset.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench sessions-dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --parquet {output.parquet:q} > {log:q} 2>&1"


rule build_quality_dataset:
    input:
        get_quality_results,
    output:
        csv=layout.QUALITY_CSV,
        parquet=layout.QUALITY_PARQUET,
    log:
        "logs/dataset/build_quality_dataset.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench quality-dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --parquet {output.parquet:q} > {log:q} 2>&1"
