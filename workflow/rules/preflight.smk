# A checkpoint, not a rule: the cells take the check as a gate (ancient, common.smk's
# _engine_check), and a check that must run again (its grid changed) hid from Snakemake's
# needrun pass every job below it, new and changed cells alike, so a run did the check
# alone and the cells waited for the next one. After a checkpoint has run, Snakemake
# decides again what else has to run.
checkpoint check_engine:
    input:
        get_engine_files,
    output:
        layout.ENGINE_CHECK,
    log:
        "logs/preflight/{engine}.log",
    priority: ORDER.engine_check_priority
    params:
        grid=ENGINE_CHECK_GRID_FILE,
    shell:
        "gridbench engine check --grid {params.grid:q} --engine {wildcards.engine:q}"
        " --out {output:q} > {log:q} 2>&1"
