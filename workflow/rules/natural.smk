rule natural_cell:
    input:
        get_natural_cell_files,
    output:
        raw="results/natural/{config}/{prompt_class}_c{concurrency}.json",
        provenance="results/natural/{config}/{prompt_class}_c{concurrency}.provenance.json",
    log:
        "logs/cells/{config}/natural_{prompt_class}_c{concurrency}.log",
    priority: get_cell_priority
    resources:
        gpu=get_cell_gpus,
    params:
        spec=get_natural_cell_spec,
    shell:
        "gridbench natural --spec {params.spec:q}"
        " --out {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
