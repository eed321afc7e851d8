"""Model folders for tests: real tokenizer files (mistral_common's, the tiny Llama's) with tiny random weights.

The weights are nonsense on purpose: these folders exist so that vLLM's own
engine can start on a tokenizer of each kind and tell what prompt ids it
receives, the oracle for procexec's rendering.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MISTRAL_TOKENIZERS = {
    # name in the model folder <- file shipped in mistral_common/data, vocabulary size
    "sentencepiece-v3": ("tokenizer.model.v3", "mistral_instruct_tokenizer_240323.model.v3", 32768),  # Mistral-7B-v0.3
    "tekken": ("tekken.json", "tekken_240911.json", 131072),  # the newer Mistral models' format
}
CLOCK_TEMPLATE = (
    "{{ '<|im_start|>system\\nCurrent date: ' + strftime_now('%Y-%m-%d') + '<|im_end|>\\n' }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def mistral_common_file(name: str) -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data" / name


def save_random_lm(out_dir: Path, vocab_size: int, bos: int | None, eos: int) -> None:
    """A 1-layer Llama (hidden 64, 2 heads of 32: vLLM's CPU attention needs head size >= 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out_dir)


def mistral_model_dir(root: Path, kind: str, weights: bool = False) -> Path:
    """A folder holding one real Mistral tokenizer file and a minimal config (plus random weights if asked)."""
    target, source, vocab = MISTRAL_TOKENIZERS[kind]
    folder = root / f"mistral-{kind}{'-lm' if weights else ''}"
    if not folder.exists():
        folder.mkdir(parents=True)
        shutil.copy(mistral_common_file(source), folder / target)
        if weights:
            save_random_lm(folder, vocab, bos=1, eos=2)
        else:
            (folder / "config.json").write_text('{"model_type": "mistral", "architectures": ["MistralForCausalLM"]}\n')
    return folder


def clock_template_dir(tiny_dir: Path, root: Path) -> Path:
    """The tiny Llama with a chat template that prints today's date, as gpt-oss's does."""
    folder = root / "tiny-clock"
    if not folder.exists():
        shutil.copytree(tiny_dir, folder)
        (folder / "chat_template.jinja").write_text(CLOCK_TEMPLATE)
    return folder
