rule build_dataset:
    input:
        get_raw_results,
    output:
        csv="dataset/dataset.csv",
        json="dataset/dataset.json",
        parquet="dataset/dataset.parquet",
    log:
        "logs/dataset/build_dataset.log",
    params:
        grid=GRID_FILE,
    shell:
        "gridbench dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --json {output.json:q} --parquet {output.parquet:q}"
        " > {log:q} 2>&1"
