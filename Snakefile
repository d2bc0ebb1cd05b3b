# gridbench: engine x quantization x speculative decoding, swept over context depth.
# The DAG lives here; the logic lives in the gridbench package (rules call its CLI).
from snakemake.utils import min_version

min_version("9.0")


# A --configfile replaces the default grid instead of being merged into it.
if not workflow.config_settings.configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/assets.smk"
include: "workflow/rules/drafts.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/natural.smk"
include: "workflow/rules/quality.smk"
include: "workflow/rules/load.smk"
include: "workflow/rules/sessions.smk"
include: "workflow/rules/dataset.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),


onstart:
    # Snakemake holds the lock now (onstart runs in no dry run)
    SWEEP.start(logger.info)


onsuccess:
    SWEEP.stop()
    shell(
        "rm -rf partial"
    )  # an earlier failed run's partial outputs are superseded
    shell(
        "mkdir -p logs/engines && gridbench engine stop --all >> logs/engines/stop.log 2>&1 || true"
    )


onerror:
    SWEEP.stop()
    shell(
        "mkdir -p logs/engines && gridbench engine stop --all >> logs/engines/stop.log 2>&1 || true"
    )
    # a failed run still ends with a dataset and report, marked partial, that list what failed
    shell(
        f"mkdir -p logs/report && gridbench finalize --grid {GRID_FILE} --outdir partial >> logs/report/finalize.log 2>&1 || true"
    )
