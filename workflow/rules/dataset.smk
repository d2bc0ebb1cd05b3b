rule build_dataset:
    input:
        get_raw_results,
    output:
        csv="dataset/dataset.csv",
        json="dataset/dataset.json",
        parquet="dataset/dataset.parquet",
    params:
        grid=GRID_FILE,
    log:
        "logs/dataset/build_dataset.log",
    shell:
        "gridbench dataset --grid {params.grid:q}"
        " --csv {output.csv:q} --json {output.json:q} --parquet {output.parquet:q}"
        " > {log:q} 2>&1"
