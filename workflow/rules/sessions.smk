# One prompt class opening concurrent multi-turn conversations (gridbench.cells.kinds.session)
rule session_cell:
    input:
        cell_inputs("session"),
    output:
        raw=CELL_KINDS["session"].patterns.raw,
        provenance=CELL_KINDS["session"].patterns.provenance,
    log:
        CELL_KINDS["session"].patterns.log,
    priority: cell_priority("session")
    resources:
        **ENGINE_MUTEXES,
        gpu=get_cell_gpus,
    params:
        context=cell_context("session"),
    shell:
        "exec gridbench cell --kind session --context {params.context:q}"
        " --at prompt_class={wildcards.prompt_class:q} sessions={wildcards.sessions:q}"
        " --raw {output.raw:q} --provenance {output.provenance:q} > {log:q} 2>&1"
