"""A tiny random-weight Llama with a locally trained BPE tokenizer and a chat template
that renders tools (Hermes style), saved as a checkpoint folder vllm loads.

Nothing is downloaded: the tokenizer is trained here on a few lines, the weights are drawn
from a seed. Run as a script to build one: ``python -m tests.agent.tiny_llm DIR``.

A random model never calls a tool by itself, so one chain is planted in its weights:
when tools are offered and the conversation does not end with a tool's output, the
chat template ends the prompt with the token ``<|call|>``, and the model then says
``<tool_call>`` `CALL` ``</tool_call>`` and stops, whatever the sampling (each step's
logit margin is in the hundreds). `CALL` is three tokens (`CALL_PIECES`), so a streaming
tool parser sees its arguments grow. Everything else it says is random text, in which the
chain's tokens never appear. How: a hidden dimension per step of the chain, and one
more, are set aside; the layers never write them (their rows of ``o_proj`` and
``down_proj`` are zero), each chain token's embedding is one large value on its own
dimension, whose ``lm_head`` column points to the next token of the chain, and every
other token's embedding holds a constant on the last one, whose column makes the chain's
tokens impossible after it.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% if tools %}<|system|>You may call these tools:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    'Answer a call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>\n'
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|tool|>{{ m.content }}\n"
    "{% elif m.tool_calls %}<|assistant|>{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "</tool_call>{% endfor %}\n"
    "{% else %}<|{{ m.role }}|>{{ m.content }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if tools and messages[-1].role != 'tool' %}<|call|>{% endif %}{% endif %}"
)
CALL_PIECES = ['{"name": "get_weather", "arguments": {"city": ', '"Par', 'is"}}']
"""The planted call's tokens: its arguments arrive in pieces."""
CALL = "".join(CALL_PIECES)
"""The call the planted chain makes: ``get_weather`` with ``{"city": "Paris"}``."""
CHAIN = ["<|call|>", "<tool_call>", *CALL_PIECES, "</tool_call>"]
CORPUS = [
    "hello could you tell me the weather for tomorrow",
    "wait stop i have another question",
    "you said the weather in paris is sunny and warm today",
    "you are a terse weather assistant answer briefly",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "21 C, sunny. It is cold and raining in London.",
] * 20
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]


def build(folder: Path, *, seed: int = 0) -> Path:
    """Write the checkpoint into ``folder`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|call|>"]})
    tokenizer.add_tokens(["<tool_call>", "</tool_call>", *CALL_PIECES])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    chain = [tokenizer.convert_tokens_to_ids(t) for t in CHAIN] + [tokenizer.eos_token_id]
    _plant(model, chain)
    model.save_pretrained(folder)
    return folder


def _plant(model: object, chain: list[int]) -> None:
    """Make each token of ``chain`` (but the last) be followed by the next, for certain."""
    import torch

    steps = len(chain) - 1
    other = steps  # the dimension every other token holds a constant on
    dims = list(range(steps + 1))
    with torch.no_grad():
        embed = model.model.embed_tokens.weight  # type: ignore[attr-defined]
        head = model.lm_head.weight  # type: ignore[attr-defined]
        for layer in model.model.layers:  # type: ignore[attr-defined]
            layer.self_attn.o_proj.weight[dims, :] = 0.0
            layer.mlp.down_proj.weight[dims, :] = 0.0
        embed[:, dims] = 0.0
        embed[:, other] = 1.0
        head[:, dims] = 0.0
        for index, token in enumerate(chain[:steps]):
            embed[token, :] = 0.0
            embed[token, index] = 100.0
            head[chain[index + 1], index] = 5.0
        head[chain[:steps], other] = -50.0  # never after an ordinary token


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
