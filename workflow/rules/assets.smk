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
