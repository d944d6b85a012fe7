"""One row of the zoo's table: whether the model built, whether the doctor ran on it, its
verdict and, for a failure, which probe and the evidence."""

from __future__ import annotations

import contextlib
import inspect
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from torch import nn

from harness.doctor.findings import FAIL
from harness.doctor.guard import UserCodeError, guarded
from harness.doctor.model.examine import diagnose_model
from harness.doctor.named import named_trap
from harness.errors import UsageError, shorten
from harness.runner import describe

LIMIT = 90.0  # seconds per case: building it and the whole diagnosis
# An allocation refused under the case's memory cap (cases.MEMORY): torch's CPU allocator, or
# oneDNN failing to make a kernel; a probe that raises it says nothing about the model
OUT_OF_MEMORY = re.compile(r"can't allocate memory|could not create a primitive|MemoryError")

# Architectures the doctor calls unhealthy for a defect reproduced and explained (the zoo's
# table states the evidence): model type -> what is wrong, reproduced with transformers 5.24
# outside the doctor (a float32 model, a left-padded batch of two).
KNOWN: dict[str, str] = {
    "deberta": "defect: under torch.autocast(float16) with a padding mask its forward raises "
    "'value cannot be converted to type c10::Half without overflow': it fills the float16 "
    "scores with float32's finfo.min (fill_overflow_half)",
    "funnel": "defect: under torch.autocast(float16) with a padding mask 8 of 16 rows of "
    "logits are not finite: its mask fill of 1e6 overflows float16 (fill_overflow_half)",
    "convbert": "defect: its span convolution runs over padded tokens unmasked, so changing the "
    "ids of left padding moves real tokens' logits by 0.008 (the padding leaks)",
    "nystromformer": "defect: its depthwise convolution over the values runs over padded "
    "tokens unmasked, so changing the ids of left padding moves real tokens' logits by 0.0009",
    "cpmant": "defect (as a causal LM): its forward marks every input token as context "
    "(context = torch.full(..., 1)), and context attends both ways, so changing tokens 4..7 "
    "moves the logits of tokens 0..3 by 18.9; a loss on labels through it sees the future",
    "dory": "defect: decoding through its own cache differs from its full forward (by 0.0037 on "
    "the first step after a 4-token prefill), and a 4-token chunk after that prefill raises a "
    "shape error (16 vs 12): its cache holds 8 tokens after 4 (one per recurrent loop)",
    "yoso": "defect: its LSH attention does not apply the attention mask to padded keys: "
    "changing the ids of left padding moves real tokens' logits by 0.016",
    "xlm": "defect (built causal): its causal mask ignores the padding mask (padded tokens are "
    "zeroed, not masked), so three left-padding tokens move real tokens' logits by 0.016",
    "falcon_mamba": "defect: a 4-token chunk fed through its cache after a 4-token prefill "
    "differs from its full forward by 0.014, while one token per step agrees (3.6e-07)",
    "jamba": "defect: with 8 layers (attention among Mamba layers), a 4-token chunk fed through "
    "its cache differs from its full forward by 6.2e-05, while one token per step agrees",
    "xlstm": "defect: decoding through its own cache raises 'matC_old has wrong shape' at this "
    "size (4 heads of 16)",
    "prophetnet": "defect: the logits of its first 4 tokens depend on how many tokens follow "
    "(alone vs within 8: 0.0031), so a prefill through its cache cannot match its full forward",
    "bamba": "defect (built with attention in its last layer; by default it has none, and "
    "then its own cache raises in get_seq_length): its forward defaults position_ids to "
    "arange(T) whatever its cache holds, so a decoding step without position ids is rotated "
    "as position 0 and differs from the full forward by 0.0031 (1.8e-07 with position ids: "
    "rope_cache_offset)",
    "recurrent_gemma": "defect: its recurrent blocks run over left padding unmasked (changing "
    "the padding's ids moves real tokens' logits by 0.14), so padding queries, which eager "
    "fills with uniform weights and SDPA with zeros, reach the real tokens: 0.048 apart",
    "gemma4_text": "at initialisation (not a defect of trained weights): its full-attention "
    "layer, 512 wide per head at any size (global_head_dim is no config field), scores "
    "RMS-normed q and k at scale 1, so 80% of its rows put >= 0.99 on one key, as its own "
    "output_attentions shows (init_unit_variance)",
    "moshi": "defect (sliding_window 4, shorter than the 8 tokens): its forward masks with "
    "create_causal_mask, ignoring the window, while the DynamicCache it makes from its config "
    "keeps sliding-window layers that drop keys older than the window, so decoding through its "
    "cache differs from its full forward from the fifth token on (by 0.21; the full forward "
    "with window 4 equals that with 4096 exactly); with its default window of 3000 the same "
    "holds past 3000 tokens",
    "minimax": "defect: its cache's reset() leaves the lightning-attention layers' state, so "
    "decoding after another prompt and reset() moves by 0.053 from a fresh cache (stale_cache)",
}
for _gemma4 in ("gemma4", "gemma4_unified", "gemma4_unified_text"):  # the same text attention
    KNOWN[_gemma4] = KNOWN["gemma4_text"]
# Decoders of encoder-decoder families, as causal LMs: they take an attention mask and no
# position ids, and count positions from the first token, padding included
_FROM_PADDING = {"bart": "0.73", "bigbird_pegasus": "0.109", "blenderbot": "0.682",
                 "blenderbot-small": "0.0176",
                 "marian": "0.515", "mbart": "0.732", "musicgen": "0.439",
                 "musicgen_melody": "0.474", "mvp": "0.73", "pegasus": "0.507",
                 "plbart": "0.102", "trocr": "0.73", "whisper": "0.445"}  # fmt: skip
for _decoder, _moved in _FROM_PADDING.items():
    KNOWN[_decoder] = (
        "defect for left-padded batches (batched generation pads on the left): it takes an "
        "attention mask but no position ids, and counts positions from the first token, padding "
        f"included, so three left-padding tokens move real tokens' logits by {_moved} "
        "(left_pad_positions: pad it on the right)"
    )
KNOWN["rwkv"] = (
    "defect for padded batches: it takes an attention mask and ignores it (its logits are the "
    "same with the mask and without), so three left-padding tokens run through its recurrence "
    "and move real tokens' logits by 1.8"
)


@dataclass
class Row:
    case: str
    class_name: str
    built: bool = False
    ran: bool = False
    healthy: bool = False
    layers: int = 0  # attention layers found
    groups: int = 0  # of them, probed
    failed: list[str] = field(default_factory=list)  # "where: probe"
    evidence: str = ""  # the first failure's, or why it did not build or run
    expected: str = ""  # an injected bug: the probe that must fail
    trap: str = ""  # and the catalogue trap that must be named (by that probe, or by a layer)
    caught: bool = False
    known: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# Config fields of hybrid models that place attention among recurrent layers: a hybrid built
# with two layers may have none, and is built again deeper.
LAYER_PATTERNS = (
    "layer_types", "attn_layer_indices", "attn_layer_period", "full_attention_interval",
    "layers_block_type", "hybrid_override_pattern",
)  # fmt: skip
DEEPER = 8


def with_attention(config: object, layers: int = 2) -> dict[str, object]:
    """Config fields that place full attention in the last of ``layers`` layers, for a hybrid
    whose default places none at any depth (Bamba's ``attn_layer_indices`` and
    GraniteMoeHybrid's ``layer_types`` default to linear attention only); empty otherwise."""
    kinds = getattr(config, "layer_types", None)
    if not kinds or any(kind != "linear_attention" for kind in kinds):
        return {}
    if hasattr(config, "attn_layer_indices"):  # layer_types is derived from it
        return {"attn_layer_indices": [layers - 1]}
    if isinstance(inspect.getattr_static(type(config), "layer_types", None), property):
        return {}  # derived from something else (Jamba's period): deeper may place some
    return {"layer_types": ["linear_attention"] * (layers - 1) + ["full_attention"]}


def diagnose_row(
    case: str, class_name: str, make: Callable[..., nn.Module], expect: str = "",
    trap: str = "", limit: float = LIMIT,
) -> Row:  # fmt: skip
    """Build the model with ``make`` and diagnose it; nothing raises out of here. A hybrid
    whose config places attention nowhere is built with it in its last layer
    (``with_attention``), and one whose two layers still hold none with ``DEEPER``."""
    known = KNOWN.get(case.rsplit("-", 2)[0], "")
    row = Row(case, class_name, expected=expect, trap=trap, known=known)
    started = time.perf_counter()
    try:
        with guarded(limit):  # one limit for the case (the probes' own then do not arm)
            model = make()
            row.built = True
            config = getattr(model, "config", None)
            hybrid = any(getattr(config, n, None) for n in LAYER_PATTERNS)
            if hybrid and (again := with_attention(config)):  # none at any depth
                with contextlib.suppress(Exception):  # a config that refuses: deeper, below
                    model = make(**again)
            try:
                diagnosis = diagnose_model(model, target=case)
            except UsageError:  # a hybrid whose two layers hold no attention may not even run
                if not hybrid:
                    raise
                diagnosis = None
            if hybrid and (diagnosis is None or not diagnosis.groups):
                diagnosis = diagnose_model(make(layers=DEEPER), target=case)
    except Exception as exc:  # it does not build, runs past the limit, or has no ids forward
        row.evidence = shorten(str(exc) if isinstance(exc, UserCodeError) else describe(exc), 200)
        return row
    if time.perf_counter() - started >= limit:  # the limit hit inside a probe, which failed
        row.evidence = f"did not finish within {limit:g} s"
        return row
    failures = [(g.paths[0], f) for g in diagnosis.groups for f in g.diagnosis.findings
                if f.status == FAIL]  # fmt: skip
    failures += [("model", f) for f in diagnosis.properties if f.status == FAIL]
    short = next((f"{where}: {f.probe}: {f.message}" for where, f in failures
                  if OUT_OF_MEMORY.search(f.message)), None)  # fmt: skip
    if short:  # the case's memory cap, not a verdict on the model
        row.evidence = shorten(f"out of the case's memory: {short}", 300)
        return row
    row.ran = True
    row.healthy = diagnosis.healthy
    row.layers = sum(len(g.paths) for g in diagnosis.groups)
    row.groups = len(diagnosis.groups)
    row.failed = [f"{where}: {f.probe}" for where, f in failures]
    if failures:
        where, first = failures[0]
        row.evidence = shorten(f"{where}: {first.probe}: {first.message}", 300)
    row.caught = bool(expect) and any(f.probe == expect for _, f in failures)
    if row.caught and trap:  # named where the bug shows, not only somewhere in the model
        named = [named_trap(g.diagnosis.findings).split(" or ") for g in diagnosis.groups]
        row.caught = any(trap in n for n in named) or any(
            f.probe == expect and trap in f.traps for _, f in failures
        )
    return row
