# llama-benchy at one context depth (gridbench.cells.kinds.benchy)
rule bench_cell:
    input:
        cell_inputs("benchy"),
    output:
        raw=CELL_KINDS["benchy"].patterns.raw,
        provenance=CELL_KINDS["benchy"].patterns.provenance,
    log:
        CELL_KINDS["benchy"].patterns.log,
    priority: cell_priority("benchy")
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=cell_context("benchy"),
    shell:
        "exec gridbench bench --context {params.context:q} --depth {wildcards.depth}"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"


# The prefix-cache pass (benchy.prefix_cache_pass): the same depth with llama-benchy's
# --enable-prefix-caching, on the config's engine with its prefix cache on.
rule bench_cached_cell:
    input:
        cell_inputs("benchy-cached"),
    output:
        raw=CELL_KINDS["benchy-cached"].patterns.raw,
        provenance=CELL_KINDS["benchy-cached"].patterns.provenance,
    log:
        CELL_KINDS["benchy-cached"].patterns.log,
    priority: cell_priority("benchy-cached")
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=cell_context("benchy-cached"),
    shell:
        "exec gridbench bench --context {params.context:q} --depth {wildcards.depth} --prefix-cache"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
