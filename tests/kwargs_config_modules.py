"""A layer built from a config class of its own file that takes its sizes as ``**kwargs`` and
declares none of them (minGPT's ``GPTConfig(vocab_size, block_size, **kwargs)``)."""

from __future__ import annotations

from torch import nn


class KwargsConfig:
    """Sets whatever it is given beyond the two sizes every model has."""

    def __init__(self, vocab_size: int, block_size: int, **kwargs: object) -> None:
        self.vocab_size, self.block_size = vocab_size, block_size
        for name, value in kwargs.items():
            setattr(self, name, value)


class ReadsItsWidth(nn.Module):
    """Reads its width and head count off the config, which never declared them."""

    def __init__(self, config: KwargsConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
