"""Tokenizer on Hugging Face `tokenizers`: encode/decode, streaming detokenisation, the Llama 3.2 chat template."""
from __future__ import annotations

from pathlib import Path

BOS, EOT, START_HEADER, END_HEADER = "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"
# Pinned so that the same chat prompt gives the same ids on any day (Meta's template inserts today's date).
KNOWLEDGE_DATE, TODAY_DATE = "December 2023", "26 Jul 2024"


class TokenizerError(ValueError):
    """tokenizer.json is missing or unreadable; the message names the file."""


class Tokenizer:
    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        self.path = path / "tokenizer.json" if path.is_dir() else path
        if not self.path.exists():
            raise TokenizerError(f"{self.path}: not found (a checkpoint folder needs tokenizer.json)")
        try:
            self._tok = HFTokenizer.from_file(str(self.path))
        except Exception as e:
            raise TokenizerError(f"{self.path}: cannot be read by tokenizers ({e})") from None
        self.bos_id = self._tok.token_to_id(BOS)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; with add_special_tokens the tokenizer's post-processor prepends <|begin_of_text|>. Through
        encode_batch, which lets go of the interpreter lock while it works, where encode() holds it to the end
        (4.3 s for 5 MB of text, in which no other thread of the process, a server's event loop included, runs
        a line). The same ids."""
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def stream(self, skip_special_tokens: bool = True) -> "DetokenizeStream":
        return DetokenizeStream(self._tok, skip_special_tokens)

    def chat_prompt(self, user: str | list[dict], system: str = "") -> str:
        """The Llama 3.2 Instruct template, ending with the assistant header (the model writes next).
        `user` is one message or a list of {"role", "content"}; a leading system message joins the system block."""
        messages = [{"role": "user", "content": user}] if isinstance(user, str) else list(user)
        if messages and messages[0]["role"] == "system":
            system, messages = messages[0]["content"], messages[1:]
        text = (f"{BOS}{START_HEADER}system{END_HEADER}\n\nCutting Knowledge Date: {KNOWLEDGE_DATE}\n"
                f"Today Date: {TODAY_DATE}\n\n{system}{EOT}")
        for m in messages:
            text += f"{START_HEADER}{m['role']}{END_HEADER}\n\n{m['content']}{EOT}"
        return text + f"{START_HEADER}assistant{END_HEADER}\n\n"

    def encode_chat(self, user: str | list[dict], system: str = "") -> list[int]:
        # The template already starts with <|begin_of_text|>: encode without adding another.
        return self.encode(self.chat_prompt(user, system), add_special_tokens=False)


class DetokenizeStream:
    """Text deltas as tokens arrive: a token that ends inside a multi-byte UTF-8 character yields "" until the
    character completes (tokenizers' DecodeStream keeps the needed prefix). `text` is what was given out so far."""

    def __init__(self, tok, skip_special_tokens: bool):
        from tokenizers.decoders import DecodeStream

        self._tok, self._skip = tok, skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.text = ""

    def step(self, token_id: int) -> str:
        delta = self._stream.step(self._tok, int(token_id)) or ""
        self.text += delta
        return delta

    def finish(self, ids) -> str:
        """At the request's end: the rest of decode(ids) that the stream still held back (a partial character
        comes out as decode() writes it); afterwards `text` is the whole decode."""
        full = self._tok.decode(list(ids), skip_special_tokens=self._skip)
        rest = full[len(self.text):] if full.startswith(self.text) else ""
        self.text = full
        return rest
