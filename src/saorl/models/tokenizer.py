"""The project's own character-level tokenizer for the built-in tasks.

Built with `tokenizers` (no download): one token per printable ASCII character plus `<pad>`,
`<eos>` and `<unk>`. Wrapped in a `PreTrainedTokenizerFast` so the rest of saorl treats it
exactly like a Hugging Face tokenizer loaded from a directory.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
# Appended last so the ids of the others never move. Off for the built-in model: adding them
# changes its random init, and the default run's measured figures come from the 98-token vocab.
WHITESPACE = ["\n", "\t"]


def build_char_tokenizer(with_newlines: bool = False) -> PreTrainedTokenizerFast:
    """A char-level tokenizer over printable ASCII; ids 0, 1, 2 are pad, eos, unk.

    `with_newlines` adds newline and tab (multi-line code for the Python tool needs them);
    without them those characters encode as `<unk>`.
    """
    chars = CHARS + WHITESPACE if with_newlines else CHARS
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own pre-token, spaces included, so ids map 1:1 to characters.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def encode_prompt(tokenizer: object, text: str) -> list[int]:
    """Token ids of a one-turn user prompt, ready for the model to continue.

    Through the tokenizer's chat template (with the generation prompt) when it has one, as a
    chat model expects; raw text otherwise (the built-in char tokenizer has no template).
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return list(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
