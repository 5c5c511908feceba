"""A tiny random-weight Whisper with a locally trained byte-level BPE tokenizer, saved as a
checkpoint folder the agent's `WhisperRunner` loads as it loads a real one.

Nothing is downloaded: the tokenizer is trained here on a few lines and wrapped as a
`WhisperTokenizer` with Whisper's special tokens; the feature extractor is the default
(80 mel bins, 30 s); the weights are drawn from a seed, with a wide spread (``init_std``)
so what it says depends on the audio. Its generation config is a multilingual one's
(``lang_to_id``, ``task_to_id``, ``no_timestamps_token_id``), and it suppresses every
token but lowercase words, so its (arbitrary) transcripts are readable words. Run as a
script to build one: ``python -m tests.agent.tiny_whisper DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|transcribe|>",
    "<|translate|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]
CORPUS = [
    "hello could you tell me the weather for tomorrow",
    "wait stop i have another question",
    "you said the weather in paris is sunny and warm today",
] * 20


TINY = {"d_model": 32, "layers": 1, "heads": 2, "ffn": 64}
WHISPER_TINY = {"d_model": 384, "layers": 4, "heads": 6, "ffn": 1536}
"""openai/whisper-tiny's shape (its 51865-token vocabulary aside): for benchmarks."""


def build(
    folder: Path,
    *,
    seed: int = 0,
    max_target_positions: int = 32,
    init_std: float = 0.5,
    shape: dict[str, int] = TINY,
) -> Path:
    """Write the checkpoint into ``folder`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL[:1],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    trained = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = WhisperTokenizer(vocab=trained["vocab"], merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    ids = dict(zip(SPECIAL, tokenizer.convert_tokens_to_ids(SPECIAL), strict=True))
    eot = ids["<|endoftext|>"]
    words = {
        i
        for i in range(len(tokenizer))
        if (piece := tokenizer.decode([i])).strip().isalpha() and piece.strip().islower()
    }
    suppress = [i for i in range(len(tokenizer)) if i not in words and i != eot]
    WhisperProcessor(
        feature_extractor=WhisperFeatureExtractor(), tokenizer=tokenizer
    ).save_pretrained(folder)
    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"],
        max_source_positions=1500,
        max_target_positions=max_target_positions,
        init_std=init_std,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        suppress_tokens=[],
        begin_suppress_tokens=[],
    )
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        lang_to_id={"<|en|>": ids["<|en|>"]},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        is_multilingual=True,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        suppress_tokens=suppress,
        begin_suppress_tokens=[eot],
        max_length=max_target_positions,
    )
    model.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
