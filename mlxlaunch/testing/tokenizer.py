"""A real byte-level BPE tokenizer, trained offline for test models.

The training text is Claude Code's system prompt and tool descriptions (bundled as package
data) plus a fixed set of Python standard-library sources, so the prompts tests send encode
to a realistic number of tokens without any download.
"""

from __future__ import annotations

import functools
import json
import sysconfig
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from mlxlaunch.testing.templates import TemplateFamily

# Standard-library modules whose source joins the training text: code, prose in docstrings
# and a little markup, much like what a coding agent sends.
STDLIB_SOURCES = (
    "argparse.py",
    "json/decoder.py",
    "json/encoder.py",
    "pathlib.py",
    "subprocess.py",
    "textwrap.py",
    "shutil.py",
    "tempfile.py",
    "dataclasses.py",
    "typing.py",
    "logging/__init__.py",
    "unittest/case.py",
    "http/client.py",
    "email/message.py",
)
CLAUDE_CODE_TEXT = "claude_code.txt"
# Some non-ASCII prose so common multi-byte characters get merges of their own.
UNICODE_SAMPLE = (
    "Grüße, café, naïve, 日本語のテキスト, emoji 🙂👍, Ελληνικά, русский текст, ≤ ≥ → ✓\n"
)


def training_texts() -> Iterator[str]:
    """Yield the documents the tokenizer is trained on."""
    data = resources.files(__package__).joinpath("data", CLAUDE_CODE_TEXT)
    yield data.read_text("utf-8")
    yield UNICODE_SAMPLE * 20
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in STDLIB_SOURCES:
        path = stdlib / name
        if path.is_file():  # a trimmed Python install may lack some modules
            yield path.read_text("utf-8", errors="replace")


def train_tokenizer(family: TemplateFamily, vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with ``vocab_size`` learned entries, then add the family's tokens.

    Added tokens take the ids right after the learned vocabulary, control tokens first.
    """
    tokenizer = Tokenizer.from_str(_learned_bpe(vocab_size))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in family.control_tokens]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in family.markup_tokens]
    )
    return tokenizer


@functools.cache
def _learned_bpe(vocab_size: int) -> str:
    """The BPE learned from `training_texts()`, serialized, before any family's tokens.

    Training takes seconds and depends on nothing but the size (the texts are fixed), while a
    test session builds tokenizers for a dozen template families: each process trains once
    per size and every family starts from a copy.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(), trainer)
    return str(tokenizer.to_str())


def write_tokenizer(
    directory: Path, family: TemplateFamily, vocab_size: int, context_window: int
) -> Tokenizer:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``AutoTokenizer``."""
    tokenizer = train_tokenizer(family, vocab_size)
    tokenizer.save(str(directory / "tokenizer.json"))
    added: dict[str, dict[str, Any]] = {}
    for token in family.added_tokens:
        added[str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": token in family.control_tokens,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": family.bos_token,
        "eos_token": family.eos_token,
        "pad_token": family.pad_token,
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_window,
        "chat_template": family.chat_template(),
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return tokenizer
