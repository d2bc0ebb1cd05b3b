# Draft heads trained for a target (the config's drafts section; gridbench.drafts): one rule a
# step, so a failed or interrupted training keeps the steps before it. A speculation that
# names a head's files (layout.DRAFT_HEAD) makes its cells wait for the training. A draft with
# data_from runs only the training, on that draft's data.


rule draft_prompts:
    output:
        prompts=layout.DRAFT_PROMPTS,
        step=layout.DRAFT_STEP.replace("{step}", "prompts"),
    log:
        "logs/drafts/{draft}/prompts.log",
    params:
        recipe_file=draft_recipe_file,
        recipe=draft_settings,
    shell:
        "gridbench draft prompts --recipe {params.recipe_file:q} > {log:q} 2>&1"


rule draft_answers:
    input:
        layout.DRAFT_PROMPTS,
        draft_target_files,
    output:
        answers=layout.DRAFT_ANSWERS,
        step=layout.DRAFT_STEP.replace("{step}", "answers"),
    log:
        "logs/drafts/{draft}/answers.log",
    params:
        recipe_file=draft_recipe_file,
        recipe=draft_settings,
    shell:
        "gridbench draft answers --recipe {params.recipe_file:q} > {log:q} 2>&1"


rule draft_dataset:
    input:
        layout.DRAFT_ANSWERS,
    output:
        step=layout.DRAFT_STEP.replace("{step}", "dataset"),
    log:
        "logs/drafts/{draft}/dataset.log",
    params:
        recipe_file=draft_recipe_file,
        recipe=draft_settings,
    shell:
        "gridbench draft dataset --recipe {params.recipe_file:q} > {log:q} 2>&1"


rule draft_hidden_states:
    input:
        layout.DRAFT_STEP.replace("{step}", "dataset"),
    output:
        step=layout.DRAFT_STEP.replace("{step}", "hidden-states"),
    log:
        "logs/drafts/{draft}/hidden-states.log",
    params:
        recipe_file=draft_recipe_file,
        recipe=draft_settings,
    shell:
        "gridbench draft hidden-states --recipe {params.recipe_file:q} > {log:q} 2>&1"


rule draft_train:
    input:
        draft_hidden_states_step,
    output:
        head=multiext(f"{layout.DRAFT_HEAD}/", *layout.DRAFT_HEAD_FILES),
        untrained=multiext(f"{layout.DRAFT_UNTRAINED_HEAD}/", *layout.DRAFT_HEAD_FILES),
        metrics=layout.DRAFT_TRAIN_METRICS,
        step=layout.DRAFT_STEP.replace("{step}", "train"),
        record=layout.DRAFT_RECORD,
    log:
        "logs/drafts/{draft}/train.log",
    params:
        recipe_file=draft_recipe_file,
        recipe=draft_settings,
    shell:
        "gridbench draft train --recipe {params.recipe_file:q} > {log:q} 2>&1"
