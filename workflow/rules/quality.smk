# A config's greedy outputs, one request per quality prompt (gridbench.cells.kinds.quality)
rule quality_cell:
    input:
        cell_inputs("quality"),
    output:
        raw=CELL_KINDS["quality"].patterns.raw,
        provenance=CELL_KINDS["quality"].patterns.provenance,
    log:
        CELL_KINDS["quality"].patterns.log,
    priority: cell_priority("quality")
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=cell_context("quality"),
    shell:
        "exec gridbench cell --kind quality --context {params.context:q}"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
