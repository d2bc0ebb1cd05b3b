# One prompt class at one concurrency (gridbench.cells.kinds.natural)
rule natural_cell:
    input:
        cell_inputs("natural"),
    output:
        raw=CELL_KINDS["natural"].patterns.raw,
        provenance=CELL_KINDS["natural"].patterns.provenance,
    log:
        CELL_KINDS["natural"].patterns.log,
    priority: cell_priority("natural")
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=cell_context("natural"),
    shell:
        "exec gridbench natural --context {params.context:q}"
        " --prompt-class {wildcards.prompt_class:q} --concurrency {wildcards.concurrency}"
        " --out {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
