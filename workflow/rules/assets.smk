rule make_corpus:
    output:
        "resources/corpus/book.txt",
    log:
        "logs/assets/corpus.log",
    shell:
        "gridbench assets corpus --out {output:q} > {log:q} 2>&1"


rule make_demo_models:
    output:
        "resources/models/demo/target-f16.gguf",
        "resources/models/demo/target-q8_0.gguf",
        "resources/models/demo/draft-q8_0.gguf",
        "resources/models/demo/tokenizer.json",
    log:
        "logs/assets/demo_models.log",
    shell:
        "gridbench assets demo-models --outdir resources/models/demo > {log:q} 2>&1"


rule make_vllm_models:
    output:
        expand(
            "resources/models/vllm/{model}/{file}",
            model=["target", "draft-self", "draft-random"],
            file=[
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
                "special_tokens_map.json",
                "chat_template.jinja",
            ],
        ),
    log:
        "logs/assets/vllm_models.log",
    shell:
        "gridbench assets vllm-models --outdir resources/models/vllm > {log:q} 2>&1"


rule make_smollm2:
    output:
        expand(
            "resources/models/smollm2-135m-instruct/smollm2-135m-instruct.{file_type}.gguf",
            file_type=["q4_1", "q8_0", "f16", "q4_0"],
        ),
        "resources/models/smollm2-135m-instruct/MANIFEST.json",
        "resources/models/smollm2-135m-instruct/tokenizer/tokenizer.json",
    log:
        "logs/assets/smollm2.log",
    shell:
        "gridbench assets real-model smollm2-135m-instruct"
        " --outdir resources/models/smollm2-135m-instruct > {log:q} 2>&1"


rule make_smollm2_hf:
    input:
        "resources/models/smollm2-135m-instruct/smollm2-135m-instruct.{file_type}.gguf",
    output:
        expand(
            "resources/models/smollm2-135m-instruct/hf-{{file_type}}/{file}",
            file=[
                "MANIFEST.json",
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
            ],
        ),
    log:
        "logs/assets/smollm2-hf-{file_type}.log",
    shell:
        "gridbench assets real-hf smollm2-135m-instruct {wildcards.file_type}"
        " --model-dir resources/models/smollm2-135m-instruct > {log:q} 2>&1"


# Gemma 3 270M, the base model (no chat template: see config/README.md, "Real models")
rule make_gemma3:
    output:
        expand(
            "resources/models/gemma3-270m/gemma3-270m.{file_type}.gguf",
            file_type=["q4_k_m", "q8_0", "f16", "q4_0"],
        ),
        "resources/models/gemma3-270m/MANIFEST.json",
        "resources/models/gemma3-270m/tokenizer/tokenizer.json",
    log:
        "logs/assets/gemma3.log",
    shell:
        "gridbench assets real-model gemma3-270m"
        " --outdir resources/models/gemma3-270m > {log:q} 2>&1"


rule make_gemma3_hf:
    input:
        "resources/models/gemma3-270m/gemma3-270m.{file_type}.gguf",
    output:
        expand(
            "resources/models/gemma3-270m/hf-{{file_type}}/{file}",
            file=[
                "MANIFEST.json",
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
            ],
        ),
    log:
        "logs/assets/gemma3-hf-{file_type}.log",
    shell:
        "gridbench assets real-hf gemma3-270m {wildcards.file_type}"
        " --model-dir resources/models/gemma3-270m > {log:q} 2>&1"
