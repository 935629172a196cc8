"""A tiny GPT-NeoX snapshot written locally (no downloads), for the tests of block hf."""

from __future__ import annotations

import torch

#: The tiny tokenizer's words: ListOps' operators split at "[" like a BPE tokenizer splits them.
WORDS = (
    ["<|endoftext|>", "<|padding|>", "[", "]", "MAX", "MIN", "MED", "SM"] + [str(i) for i in range(10)] + list("ab ")
)


def write_tiny_lm(root, *, weights=True, tokenizer=True, vocab_size=40):
    """A 2-layer GPT-NeoX of width 32 saved like a Hub snapshot (config, weights, tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

    root.mkdir(parents=True, exist_ok=True)
    config = GPTNeoXConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=512,
        eos_token_id=0,
        bos_token_id=0,
    )
    torch.manual_seed(123)
    lm = GPTNeoXForCausalLM(config)
    if weights:
        lm.save_pretrained(root)
    else:
        config.save_pretrained(root)
    if tokenizer:
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
        tok.pre_tokenizer = pre_tokenizers.Punctuation()
        PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|padding|>", unk_token="<|endoftext|>"
        ).save_pretrained(root)
    return lm
