"""The doctor's options, in one table: the command line's flags and help, ``Config``'s fields and
checks, and the ``attention_doctor`` fixture's documentation all come from ``OPTIONS``.

Import-light on purpose (the pytest plugin reads it when it loads): plain data, no torch.
Each option says what each of its values means, since the doctor cannot see what the user knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What each option takes, where a value is one of a few words.
MASKS = ("auto", "keep", "drop", "additive", "none")
MASK_SHAPES = ("bqk", "b1qk", "bk", "b11k", "qk")  # harness.masks.LAYOUTS (a test holds it)
MASK_DTYPES = ("bool", "float")
POSITIONS = ("auto", "none", "absolute", "relative")
PAIRINGS = ("auto", "half", "interleaved")
GROUPINGS = ("auto", "blocks", "strided")
DTYPES = ("float32", "bfloat16", "float16")  # what --dtype says it runs in
# Flags that said again what another says, and what says it now.
RETIRED = {"--positional": "--positions relative or absolute", "--float16": "--dtype float16"}
TIMEOUT = 60.0  # seconds per guarded step (each probe), unless told otherwise; 0: none


@dataclass(frozen=True)
class Option:
    """One option: its ``Config`` field (or fixture keyword), its command-line form and what it
    means. ``kind`` is "flag" (present or not), "choice", "int", "float", "seed", "scale" or
    "text";
    ``config``:
    False for options of the command line alone (building the module, printing, writing)."""

    name: str
    help: str
    kind: str = "text"
    default: Any = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    config: bool = True
    repeat: bool = False  # given once per value (--init a=1 --init b=2)
    group: str = ""  # what it declares, as --help groups it (GROUPS)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS = (
    Option(
        "mask", group="mask", kind="choice", default="auto", choices=MASKS,
        help="the module's mask convention: keep (1/True attends), drop (True is blocked, as "
        "nn.MultiheadAttention), additive (a float added to the scores); none: the caller "
        "never passes a mask, so nothing is probed with one whatever forward's signature "
        "says; auto (default): a forward that takes a mask is probed under each reading until "
        "one stops every leak, and fails when none does, so a broken mask never passes",
    ),
    Option(
        "causal", group="computes", kind="flag", default=False,
        help="it masks the future by itself (whether or not it also takes a padding mask)",
    ),
    Option(
        "mask_shape", group="mask", kind="choice", default="bqk", choices=MASK_SHAPES,
        help="bqk: (B, T, T); b1qk: (B, 1, T, T); bk: key padding (B, T); b11k: key padding "
        "(B, 1, 1, T), BERT's extended mask; qk: (T, T), one for every sequence, as Whisper's "
        "mask[:T, :T] and nn.MultiheadAttention's attn_mask (no padding to probe then)",
    ),
    Option(
        "mask_dtype", group="mask", kind="choice", default="bool", choices=MASK_DTYPES,
        help="keep/drop masks as bool (default) or as float 0/1",
    ),
    Option(
        "mask_arg", group="mask", metavar="NAME",
        help="the forward parameter that gets the mask, when it has several (attn_mask, "
        "key_padding_mask, ...); default: the one that works",
    ),
    Option(
        "sequence_first", group="computes", kind="flag", default=False,
        help="it takes (T, B, d) tensors, as fairseq and torch's batch_first=False (read off a "
        "module's batch_first attribute when it has one); the masks and positions it is "
        "handed stay batch-first, (B, T) and (B, T, T), as Megatron's and ChatGLM's are",
    ),
    Option(
        "positions", group="positions", kind="choice", default="auto", choices=POSITIONS,
        help="its position scheme: relative (rotary, ALiBi, a learned bias per offset as T5's, "
        "BEiT's or LeViT's tables: a shift of every position changes nothing, a swap of two "
        "tokens does; with no positions argument only the swap is probed), absolute (learned "
        "or sinusoidal, or tokens mixed by a convolution of its own), none (no positions: the "
        "permutation probe holds it to permutation equivariance); auto: detected (default)",
    ),
    Option(
        "rope_pairing", group="positions", kind="choice", default="auto", choices=PAIRINGS,
        help="how its checkpoint pairs rotary dimensions: half (i with i + d/2, d the rotated "
        "width: --rotary-dims where partial; transformers' rotate_half) or interleaved (2i "
        "with 2i + 1, Meta's complex form); auto: either",
    ),
    Option(
        "rotary_dims", group="positions", kind="int", metavar="N",
        help="partial rotary: the rotation turns only the first N dimensions of each head (GPT-"
        "NeoX, Phi, GPT-J); default: read off the module (rotary_ndims, rotary_dim) or its "
        "config (partial_rotary_factor), else the whole head",
    ),
    Option(
        "rope_base", group="positions", kind="float", metavar="THETA",
        help="its rotary base (theta; 10000 in the RoPE paper, 500000 in Llama 3, 1000000 in "
        "Qwen2 and InternLM2): SDPA's reference and the rotary tables the doctor makes use it; "
        "default: read off the module, its rotary embedding or its config (rope_theta, "
        "rotary_emb_base, rope_parameters), else 10000",
    ),
    Option(
        "kv_heads", group="heads", kind="int", metavar="N",
        help="grouped K/V heads: built with N, given to whichever of num_key_value_heads, "
        "n_kv_heads, kv_heads, num_kv_heads, n_kv_head, n_query_groups the constructor takes "
        "(another name: --init NAME=N; default: half the heads), and probed as such when they "
        "cannot be read off the module",
    ),
    Option(
        "kv_grouping", group="heads", kind="choice", default="auto", choices=GROUPINGS,
        help="which query heads share a K/V head: blocks (head i reads K/V head i // n_rep, "
        "repeat_interleave: Llama, Mistral, Qwen checkpoints) or strided (i % n_kv, repeat); "
        "auto: either, with a warning for strided",
    ),
    Option(
        "window", group="computes", kind="int", metavar="W",
        help="a sliding window of W keys, the query's own included (query t sees t - W + 1 .. "
        "t); default: read off it (sliding_window, window_size, ...) as that count: pass W "
        "where a library counts only the keys before the query (RecurrentGemma: window_size + "
        "1)",
    ),
    Option(
        "packed", group="computes", kind="flag", default=False,
        help="positions restarting at 0 start a new packed document, which must not see the "
        "one before",
    ),
    Option(
        "call", group="build", metavar="FILE.py:FN",
        help="call the module through FN(module, x, *, positions, mask, cache), the way your "
        "model does (FN.make_cache, else the file's make_cache(), gives it a cache); e.g. "
        "harness.doctor.adapters:transformers (in Python: the function itself)",
    ),
    Option(
        "scale", group="computes", kind="scale", metavar="VALUE|none",
        help="the factor the module means to put on its scores: a number, or none for attention "
        "unscaled by design (T5, GPT-Neo; in Python: 1.0); default: 1/sqrt(head width), as "
        "SDPA's, the width q and k are contracted over (not the values', where they differ)",
    ),
    Option(
        "softcap", group="computes", kind="float", metavar="CAP",
        help="it caps its scores as cap * tanh(scores / cap) before the mask (Gemma2's "
        "attn_logit_softcapping, Grok): SDPA's reference is capped the same; default: read off "
        "the module or its config (attn_logit_softcapping, softcap, logit_softcapping), else "
        "none",
    ),
    Option(
        "d_model", group="build", kind="int", default=64,
        help="its width, passed to the factory (64; in Python: read off the module when None)",
    ),
    Option(
        "heads", group="build", kind="int", default=4, config=False,
        help="passed to the factory (4)",
    ),
    Option(
        "init", group="build", metavar="NAME=VALUE", config=False, repeat=True, default=(),
        help="a constructor or config value the doctor cannot guess (a Python literal, else a "
        "string); repeatable",
    ),
    Option(
        "dtype", group="computes", kind="choice", default="float32", choices=DTYPES,
        help="the dtype it runs in where it is used (autocast or .half()): float32, bfloat16 "
        "(float32's range: nothing overflows), or float16, where "
        "activations grow large, as mixed-precision training and Stable Diffusion's UNet run: "
        "Q K^T overflowing where scaling Q first stays finite then fails (qk_overflow_half), and "
        "so does a mask fill past float16's range such as -1e9 (fill_overflow_half); otherwise "
        "they are a note and a warning, since textbook attention does the same (float32)",
    ),
    Option(
        "seed", group="probes", kind="seed", default=0,
        help="seed for weights and inputs, 0 .. 2**32 - 1 (0)",
    ),
    Option(
        "batch", group="probes", kind="int", default=4,
        help="sequences per probe call (4; at least 2)",
    ),
    Option(
        "seq_len", group="probes", kind="int", default=8,
        help="tokens per sequence (8; at least 3)",
    ),
    Option("device", group="probes", default="cpu", help="cpu or cuda (cpu)"),
    Option("strict", group="probes", kind="flag", default=False, help="warnings fail too"),
    Option(
        "model", group="build", kind="flag", default=False, config=False,
        help="the target is a whole model (default: read off its forward, which takes token "
        "ids: input_ids, idx, tokens): its attention layers are found and probed as the model "
        "calls them, then the model's causality, batch independence, left padding, cache, "
        "backends and low precision",
    ),
    Option(
        "layers", group="build", kind="int", default=2, config=False,
        help="a whole model's depth, passed to its factory or config (2)",
    ),
    Option(
        "json", group="output", kind="flag", default=False, config=False,
        help="print JSON instead of text",
    ),
    Option(
        "report", group="output", metavar="PATH", config=False,
        help="also write a markdown report here",
    ),
    Option(
        "fix", group="output", metavar="PATH", config=False,
        help="write the proven fixes here as a unified diff against your files (which are never "
        "changed; apply it with git apply or patch -p1)",
    ),
    Option(
        "timeout", group="probes", kind="float", default=TIMEOUT, metavar="SECONDS", config=False,
        help=f"time limit of each probe, of building the module and of importing --call "
        f"({TIMEOUT:g}; 0: none)",
    ),
)  # fmt: skip
BY_NAME = {option.name: option for option in OPTIONS}
# --help's groups, in order: what each group's options declare
GROUPS = {
    "mask": "the module's mask (how a caller hands it)",
    "computes": "what the module computes on purpose",
    "positions": "its positions",
    "heads": "its heads",
    "build": "building and calling it",
    "probes": "the probes",
    "output": "output",
}


def keywords_doc() -> str:
    """The options as Python keywords (``Config`` and the fixture), one per line."""
    lines = [f"- ``{o.name}``: {o.help}" for o in OPTIONS if o.config]
    lines.append(f"- ``timeout``: {BY_NAME['timeout'].help}")
    return "\n".join(lines)
