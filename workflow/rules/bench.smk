rule bench_cell:
    input:
        get_cell_files,
    output:
        raw=layout.RAW,
        provenance=layout.PROVENANCE,
    log:
        layout.CELL_LOG,
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
        raw=layout.CACHED_RAW,
        provenance=layout.CACHED_PROVENANCE,
    log:
        layout.CACHED_LOG,
    priority: get_cached_cell_priority
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=get_cell_context,
    shell:
        "exec gridbench bench --context {params.context:q} --depth {wildcards.depth} --prefix-cache"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
