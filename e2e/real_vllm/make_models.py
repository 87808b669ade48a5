"""Build a tiny Llama model, its tokenizer and LoRA adapters, offline, for real vLLM servers.

Run with the vLLM virtualenv's Python (it has torch, transformers, tokenizers and peft):

    .venv-vllm/bin/python e2e/real_vllm/make_models.py OUT_DIR [--adapters 5]

Writes `OUT_DIR/tiny-llama/` (config, safetensors weights, tokenizer, chat template) and
`OUT_DIR/lora-0 … lora-N-1/` (peft adapters). Weights are random but seeded, so every build is
the same; nothing is downloaded. The geometry keeps vLLM's CPU attention happy (head size 32)
and the model small enough (≈ 213 k parameters) that a 2-core machine serves it in milliseconds.
`init_lora_weights=False` makes each adapter's B matrix non-zero, so adapters really change
the output. Prints one line per artefact; exits 0 when `OUT_DIR` already holds a complete build.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys

BASE_NAME = "tiny-llama"
ADAPTER_PREFIX = "lora-"
VOCAB_SIZE = 1024
TOKENIZER_VOCAB = 1000
CORPUS_LINES = 5000
WORDS_PER_LINE = 12
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
# Words the test prompts use, so they tokenise into a few hundred sensible tokens.
WORDS = (
    "router", "gateway", "envoy", "endpoint", "picker", "pool", "pod", "model", "adapter", "lora", "slot",
    "cache", "prefix", "token", "request", "response", "queue", "batch", "kv", "block", "prefill", "decode",
    "latency", "throughput", "scheduler", "score", "filter", "weight", "shard", "replica", "hello", "world",
    "quick", "brown", "fox", "jumps", "lazy", "dog",
)  # fmt: skip
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}assistant:"
)
DONE_MARKER = ".complete"


def adapter_names(count: int) -> list[str]:
    return [f"{ADAPTER_PREFIX}{i}" for i in range(count)]


def build_tokenizer(out: pathlib.Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found,unused-ignore]
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found,unused-ignore]

    rng = random.Random(0)
    corpus = [
        " ".join(rng.choice(WORDS) for _ in range(WORDS_PER_LINE)) + f" {n}" for n in range(CORPUS_LINES)
    ]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(str(out))


def build_base(out: pathlib.Path) -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found,unused-ignore]

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32: the smallest vLLM's CPU attention supports
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(str(out), safe_serialization=True)


def build_adapter(base: pathlib.Path, out: pathlib.Path, seed: int) -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from peft import LoraConfig, get_peft_model  # type: ignore[import-not-found,unused-ignore]
    from transformers import LlamaForCausalLM  # type: ignore[import-not-found,unused-ignore]

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(str(base))
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj"],
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    get_peft_model(model, lora).save_pretrained(str(out))


def build(out_dir: pathlib.Path, adapters: int) -> list[pathlib.Path]:
    """Build everything under `out_dir`; skip when a previous build with as many adapters finished."""
    marker = out_dir / DONE_MARKER
    if marker.is_file() and marker.read_text().strip() == str(adapters):
        print(f"make_models: {out_dir} already complete", flush=True)
        return [out_dir / BASE_NAME, *(out_dir / name for name in adapter_names(adapters))]
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / BASE_NAME
    build_tokenizer(base)
    build_base(base)
    print(f"make_models: base model {base}", flush=True)
    built = [base]
    for index, name in enumerate(adapter_names(adapters)):
        path = out_dir / name
        build_adapter(base, path, seed=100 + index)
        print(f"make_models: adapter {path}", flush=True)
        built.append(path)
    marker.write_text(f"{adapters}\n")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=pathlib.Path, help="directory to write models into")
    parser.add_argument("--adapters", type=int, default=5, help="number of LoRA adapters (default 5)")
    args = parser.parse_args(argv)
    if args.adapters < 0:
        parser.error("--adapters must be ≥ 0")
    build(args.out_dir, args.adapters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
