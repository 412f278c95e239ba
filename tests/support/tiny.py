"""Tiny random models built locally: real architectures for tests and benchmarks, not for judging.

``build_tiny_llama`` trains a byte-level BPE tokenizer on a few hundred sentences, gives it a
ChatML-style chat template and saves a 2-layer Llama with random weights; ``build_tiny_lora``
saves a random (non-identity) LoRA adapter for it with peft. Both take seconds on a CPU.
"""

from __future__ import annotations

import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}"
    "{% endfor %}{% endif %}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "<tool_call>\n{\"name\": \"{{ call['function']['name'] }}\", "
    "{% set args = call['function']['arguments'] %}"
    '"arguments": {{ args if args is string else args | tojson }}}\n</tool_call>'
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
]

_WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "it",
    "from",
    "at",
    "are",
    "this",
    "be",
    "which",
    "an",
    "or",
    "has",
    "river",
    "city",
    "year",
    "population",
    "metre",
    "kilometre",
    "energy",
    "claim",
    "fact",
    "source",
    "answer",
    "question",
    "context",
    "report",
    "study",
    "people",
    "country",
    "water",
    "temperature",
    "degrees",
    "celsius",
    "kelvin",
    "paris",
    "london",
    "berlin",
    "score",
    "relevant",
    "support",
    "evidence",
    "model",
    "summary",
    "paper",
    "result",
    "true",
    "false",
    "yes",
    "no",
    "unknown",
]


def _training_text(n: int = 600, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    digits = [str(d) for d in range(10)]
    return [
        " ".join(rng.choice(_WORDS + digits) for _ in range(rng.randint(5, 20))) + "."
        for _ in range(n)
    ] + ['{"answer": "yes", "score": 3}', "Score: 1 2 3 4 5", "A: unknown [Confidence: 2]"]


# A reasoning model's template, as DeepSeek-R1 distills have it: the answer turn opens with
# <think>, so everything until </think> is reasoning (vLLM's deepseek_r1 parser splits it off).
REASONING_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}"
)
THINK_TOKENS = ["<think>", "</think>"]


def build_tiny_tokenizer(vocab_size: int = 512, reasoning: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + (THINK_TOKENS if reasoning else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = REASONING_TEMPLATE if reasoning else CHAT_TEMPLATE
    return fast


def build_tiny_llama(
    target: Path | str, hidden: int = 256, layers: int = 2, seed: int = 0, reasoning: bool = False
) -> Path:
    """``reasoning``: a tokenizer with <think> / </think> and a template that opens the answer
    turn with <think> (a reasoning model's shape; random weights never close it)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    target = Path(target)
    tokenizer = build_tiny_tokenizer(reasoning=reasoning)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def build_tiny_lora(base: Path | str, target: Path | str, rank: int = 8, seed: int = 1) -> Path:
    """A random LoRA adapter whose outputs visibly differ from the base model's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # peft's random init is small; make the adapter matter
                param.mul_(20.0)
    peft_model.save_pretrained(target)
    return Path(target)


def build_tiny_classifier(
    target: Path | str,
    architecture: str = "deberta-v2",
    labels: tuple[str, ...] = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION"),
    seed: int = 0,
    tokenizer=None,
    shape: dict | None = None,
) -> Path:
    """A random sequence-classification model (DeBERTa-v2 or BERT) with the given label order.

    ``tokenizer`` (a loaded pair tokenizer, e.g. a real WordPiece one for real token counts) and
    ``shape`` (config fields: layers, width, DeBERTa-v3's relative attention) make bigger models
    of the same kind (``scripts/gpu_check.py``)."""
    import torch
    from tokenizers import processors
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        DebertaV2Config,
        DebertaV2ForSequenceClassification,
    )

    target = Path(target)
    if tokenizer is None:
        tokenizer = build_tiny_tokenizer()
        tokenizer.add_special_tokens({"cls_token": "<s>", "sep_token": "</s>"})
        cls, sep = tokenizer.convert_tokens_to_ids(["<s>", "</s>"])
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> $B:1 </s>:1",
            special_tokens=[("<s>", cls), ("</s>", sep)],
        )  # a real pair encoding: [CLS] premise [SEP] hypothesis [SEP]
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "pad_token_id": tokenizer.pad_token_id,
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {n: i for i, n in enumerate(labels)},
    }
    common |= shape or {}
    torch.manual_seed(seed)
    if architecture == "bert":
        model = BertForSequenceClassification(BertConfig(**common))
    else:
        model = DebertaV2ForSequenceClassification(
            DebertaV2Config(**{"type_vocab_size": 0} | common)
        )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def build_tiny_encoder(
    target: Path | str, tokenizer=None, shape: dict | None = None, seed: int = 0
) -> Path:
    """A random sentence-transformers encoder (BERT, mean pooling, normalised) saved as a model
    folder ``SentenceTransformer(target)`` loads: tiny by default, MiniLM-sized with ``shape``."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    target = Path(target)
    if tokenizer is None:
        tokenizer = build_tiny_tokenizer()
        tokenizer.add_special_tokens({"cls_token": "<s>", "sep_token": "</s>"})
    config = BertConfig(
        **{
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 512,
            "pad_token_id": tokenizer.pad_token_id,
        }
        | (shape or {})
    )
    torch.manual_seed(seed)
    raw = target.with_name(target.name + "-hf")
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    word = models.Transformer(str(raw), max_seq_length=256)
    pooling = models.Pooling(config.hidden_size, pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu").save(str(target))
    return target
