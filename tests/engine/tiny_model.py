"""Make a tiny random-weight Llama + tokenizer locally (no hub access), byte-identical run to run.

Run with the engine venv's python (it needs torch, transformers and tokenizers)::

    .engine/vllm-venv/bin/python tests/engine/tiny_model.py OUT_DIR

Model: ``LlamaConfig`` hidden 128, intermediate 256, 2 layers, 4 heads (head_dim 32), max
positions 512, float32, weights re-drawn from N(0, 0.2) so greedy generations are not
degenerate. Tokenizer: byte-level BPE trained on a few hundred synthetic lines, wrapped in
``PreTrainedTokenizerFast`` with a small chat template.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SEED = 1234
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4
MAX_POSITIONS = 512
VOCAB_TARGET = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
_WORDS = (  # noqa: SIM905
    "the a an adapter model replica tenant request token router gateway registry version canary "
    "rollback load unload stage verify hash weight rank alpha layer query value output input "
    "quick brown fox jumps over lazy dog hello world loraplane vllm serve many small fast slow "
    "red green blue one two three four five six seven eight nine ten and or not is are was"
).split()


def _corpus(n: int = 400) -> list[str]:
    rng = random.Random(SEED)
    lines = []
    for _ in range(n):
        k = rng.randint(4, 16)
        words = [rng.choice(_WORDS) for _ in range(k)]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ","]))
    return lines


def build(out: Path) -> dict[str, Any]:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    random.seed(SEED)
    torch.manual_seed(SEED)
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model = model.to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    return {"vocab_size": len(fast), "params": sum(p.numel() for p in model.parameters())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    info = build(Path(argv[0]))
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
