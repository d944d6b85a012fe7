"""Benchmark: the doctor on a GPT-sized causal attention (d_model 768, 12 heads, batch 2).

    python .ci/bench_doctor.py [--seq-len 256] [--threads 2]

Prints the wall time of one diagnosis and each probe's share. Not a test: times vary by machine.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """nanoGPT-style causal attention on SDPA."""

    def __init__(self, n_embd: int = 768, n_head: int = 12):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def timed(name: str, function, timings: dict[str, float]):
    """``function``, recording its wall time under ``name``."""

    def run(subject):
        start = time.perf_counter()
        try:
            return function(subject)
        finally:
            timings[name] = time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from harness.doctor import Config, diagnose, probes

    timings: dict[str, float] = {}
    for name, function in list(probes.PROBES.items()):
        probes.PROBES[name] = timed(name, function, timings)

    torch.manual_seed(0)
    module = CausalSelfAttention()
    start = time.perf_counter()
    diagnosis = diagnose(module, Config(causal=True, batch=2, seq_len=args.seq_len))
    elapsed = time.perf_counter() - start
    print(diagnosis.text())
    for name, seconds in sorted(timings.items(), key=lambda item: -item[1]):
        print(f"  {seconds:6.2f} s  {name}")
    print(f"seq_len {args.seq_len}: {elapsed:.1f} s on {args.threads} threads")


if __name__ == "__main__":
    main()
