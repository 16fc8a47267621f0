"""A real tokenizer.json for generated checkpoints: byte-level BPE trained with the `tokenizers`
library on a small embedded text, deterministic, with ChatML special tokens and template."""
from __future__ import annotations

import json
from pathlib import Path

_TEXT = """
The quick brown fox jumps over the lazy dog. A language model reads tokens and writes tokens.
hwinfer runs the same model definition on every accelerator: NVIDIA, AMD, Intel, Ascend and the CPU.
Attention looks back over the context; linear attention keeps a state; experts share the work.
Once upon a time there was a small model that learned to count: one, two, three, four, five.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.
def add(a, b):\n    return a + b\nprint(add(2, 3))\n
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols + - * / = ( ) [ ] { } < > , . ; : ! ?
""" * 4

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_tokenizer(path: Path, vocab_size: int) -> dict[str, int]:
    """Write tokenizer.json and tokenizer_config.json; returns the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT], trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer vocab {tok.get_vocab_size()} exceeds the model's {vocab_size}")
    tok.save(str(path / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "add_bos_token": False, "chat_template": CHATML_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
    }, indent=2))
    return ids
