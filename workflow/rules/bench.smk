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


# The prefix-cache pass (benchy.prefix_cache_pass): the same depth with llama-benchy's
# --enable-prefix-caching, on the config's engine with its prefix cache on.
rule bench_cached_cell:
    input:
        get_cell_files,
    output:
        raw="results/raw/{config}/depth_{depth}.pc.json",
        provenance="results/raw/{config}/depth_{depth}.pc.provenance.json",
    log:
        "logs/cells/{config}/depth_{depth}.pc.log",
    priority: get_cached_cell_priority
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=get_cell_context,
    shell:
        "exec gridbench bench --context {params.context:q} --depth {wildcards.depth} --prefix-cache"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
