rule bench_cell:
    input:
        get_cell_files,
    output:
        raw="results/raw/{config}/depth_{depth}.json",
        provenance="results/raw/{config}/depth_{depth}.provenance.json",
    log:
        "logs/cells/{config}/depth_{depth}.log",
    priority: get_cell_priority
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=get_cell_context,
    shell:
        "exec gridbench bench --context {params.context:q} --depth {wildcards.depth}"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
