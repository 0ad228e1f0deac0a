"""From a user's prompt to token ids, and the stop rules: the part of a request every stage handles alike."""
from __future__ import annotations

from pathlib import Path

from common.config import LlamaConfig, read_generation_stop_ids
from common.sampling import SamplingParams
from common.tokenizer import Tokenizer


class PromptError(ValueError):
    """A prompt the engine cannot run: too long for max_model_len, empty, ids outside the vocabulary, or (a paged
    engine) with its max_tokens, more than the whole KV cache holds."""


class PromptPreparer:
    def __init__(self, folder: str | Path, config: LlamaConfig, max_model_len: int | None = None):
        self.config = config
        self.tokenizer = Tokenizer(folder)
        # None is "the default"; 0 is a value like any other, and refused below
        self.max_model_len = min(config.max_position_embeddings, 4096) if max_model_len is None else max_model_len
        if not 1 < self.max_model_len <= config.max_position_embeddings:
            raise PromptError(f"max_model_len={self.max_model_len} must be in [2, max_position_embeddings="
                              f"{config.max_position_embeddings}]")
        # The model's own stop ids: config.json's eos plus generation_config.json's (Instruct: 128001/8/9).
        self.model_stop_ids = tuple(dict.fromkeys((*config.eos_token_ids, *read_generation_stop_ids(folder))))

    @staticmethod
    def normalise(prompts) -> list:
        """One prompt (str or list of ids) or a list of them -> a list of prompts."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            return [prompts]
        return list(prompts)

    def encode(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise PromptError("empty prompt: nothing to condition on")
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self.config.vocab_size)]
        if bad:
            raise PromptError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {self.config.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise PromptError(f"prompt of {len(ids)} tokens does not fit max_model_len={self.max_model_len} "
                              "(it needs room for at least one new token)")
        return ids

    def requests(self, prompts, params: SamplingParams | list[SamplingParams]
                 ) -> list[tuple[list[int], SamplingParams]]:
        """generate()'s arguments -> (token ids, params) per request; every prompt is checked before any runs."""
        prompts = self.normalise(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise PromptError(f"{len(prompts)} prompts but {len(params_list)} SamplingParams")
        return [(self.encode(p), sp) for p, sp in zip(prompts, params_list)]

    def stop_ids(self, params: SamplingParams) -> frozenset[int]:
        return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(self.model_stop_ids))

    def finish_reason(self, new_ids: list[int], seq_len: int, params: SamplingParams, stop: frozenset[int]):
        """"stop" when the last token is a stop id, "length" at max_tokens or max_model_len, else None."""
        if new_ids and new_ids[-1] in stop:
            return "stop"
        if len(new_ids) >= params.max_tokens or seq_len >= self.max_model_len:
            return "length"
        return None
