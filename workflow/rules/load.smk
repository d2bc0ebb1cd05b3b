# One prompt class at one arrival process and request rate, open loop (gridbench.cells.kinds.load)
rule load_cell:
    input:
        cell_inputs("load"),
    output:
        raw=CELL_KINDS["load"].patterns.raw,
        provenance=CELL_KINDS["load"].patterns.provenance,
    log:
        CELL_KINDS["load"].patterns.log,
    priority: cell_priority("load")
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=cell_context("load"),
    shell:
        "exec gridbench cell --kind load --context {params.context:q}"
        " --at prompt_class={wildcards.prompt_class:q} arrival={wildcards.arrival:q}"
        " rate={wildcards.rate:q}"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
