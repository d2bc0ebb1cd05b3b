rule natural_cell:
    input:
        get_natural_cell_files,
    output:
        raw=layout.NATURAL,
        provenance=layout.NATURAL_PROVENANCE,
    log:
        layout.NATURAL_LOG,
    priority: get_cell_priority
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=get_natural_cell_context,
    shell:
        "exec gridbench natural --context {params.context:q}"
        " --prompt-class {wildcards.prompt_class:q} --concurrency {wildcards.concurrency}"
        " --out {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
