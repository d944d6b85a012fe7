"""What one reading of a module holds: facts, each with how it is known and its source line,
and the traps they name (``harness.doctor.reading.facts`` reads them from a recorded forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from harness.doctor.reading.record import Op

# How a value is known, strongest first (the order): what the user declared, what the
# record computed, what the module states (attributes, buffers), its config, a default.
DECLARED, COMPUTED, STATED, CONFIG, DEFAULT = "declared", "computed", "stated", "config", "default"


@dataclass(frozen=True)
class Fact:
    """One thing the doctor knows about the module, how it knows it, and where (a source
    line, "" when none)."""

    name: str
    value: str
    source: str = COMPUTED
    line: str = ""

    def text(self) -> str:
        at = f" at {self.line}" if self.line else ""
        return f"{self.name}: {self.value} ({self.source}{at})"


@dataclass(frozen=True)
class Named:
    """A trap named from a computed fact: the trap, why, and the line to look at."""

    trap: str
    why: str
    line: str
    also: tuple[str, ...] = ()  # other lines it involves (where its factors are applied or made)
    located: bool = False  # only where to look: a cause only of the failures that name it
    # ... that name it alone: what the forward shows is no evidence of the trap by itself
    # (every causal module makes a triangle; only a probe can say it is anchored wrong)
    sole: bool = False


@dataclass
class Reading:
    """What one recorded forward shows: facts, the traps they name, and the op that raised."""

    facts: list[Fact] = field(default_factory=list)
    named: list[Named] = field(default_factory=list)
    raised: Op | None = None
    attention_found: bool = False
    # where the module masks the future itself: its own mask blocks keys after their query and
    # none before it (a causal triangle, or one built a diagonal off), or SDPA is told
    # is_causal=True; "" where the record shows neither
    masks_future: str = ""
    rotary: str = ""  # where its queries or keys are rotated; "" where the record shows none
    mask_unread: str = ""  # where a mask it was given goes unread (no fill, no attn_mask)
    # the parameters the attention's queries, keys, values and output are projected by, as
    # the record shows them ({} where it does not show all of q, k and v)
    projections: dict[str, str | None] = field(default_factory=dict)
    head_width: int | None = None  # the width each head's q and k are contracted over
    # the activation scale at which the scores outgrow a finite fill (None: none they can)
    outgrown_at: float | None = None
    # the module joins a triangle or band it built to the caller's mask, which hides it
    joins_own: bool = False
    angles_half: bool = False  # rotary's angles are made in half precision even in float32
    gated: str = ""  # where its output is multiplied by a gate of the input before projection
    # the query heads that read copies of one K/V head's values, and keys (None: no head
    # copies another)
    shared_values: list[frozenset[int]] | None = None
    shared_keys: list[frozenset[int]] | None = None
    # the first softmax's weights as the recorded forward computed them, keys' axis last
    # (None: no softmax of a product was recorded, or an SDPA call keeps them inside)
    weights: Tensor | None = None
    # where its second output looks like weights but is not computed from a softmax (T5's and
    # Pix2Struct's position bias, returned beside the output): what it is
    second_not_weights: str = ""
