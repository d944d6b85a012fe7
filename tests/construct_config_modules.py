"""A module built from a config object with no config class anywhere near it."""

from torch import nn


class ReadsManyNames(nn.Module):
    """Reads two names the doctor knows and two it cannot guess."""

    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.embed = nn.Embedding(cfg.num_labels, cfg.n_embd)
        self.style = cfg.norm_style
        self.heads = cfg.n_head
