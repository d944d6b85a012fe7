"""The catalogue's fix of each trap that lives in one expression, rewritten into the user's own
line: each recipe yields candidate sources, most likely first; none is shown until one is proven
(``prove``). A recipe reads what the line's code does (which call, which argument), never what
its variables are called, and a candidate the proof rejects costs only time.

One module per family of traps (masks, scales, layout, positions, training); ``RECIPES`` maps
each trap the doctor can fix to its recipe."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from harness.doctor.fixes.line import Line
from harness.doctor.fixes.recipes.layout import (
    gqa_kv_grouping,
    head_merge_no_transpose,
    head_split_view,
    mask_rank,
    padding_on_queries,
    softmax_dim,
    transpose,
)
from harness.doctor.fixes.recipes.masks import (
    additive_nan,
    bottom_right,
    cap_before_mask,
    causal_leak,
    finite_fill,
    mask_bool,
    sdpa_float_mask,
    sdpa_mask_inverted,
    window_bound,
)
from harness.doctor.fixes.recipes.positions import (
    angles_in_float32,
    last_rows,
    repeated_other_way,
    rope_on_value,
)
from harness.doctor.fixes.recipes.scales import (
    double_scale,
    missing_scale,
    scale_after_softmax,
    scale_d_model,
    scale_queries_first,
    softmax_written_out,
)
from harness.doctor.fixes.recipes.training import drawn_smaller, dropout_in_eval

Recipe = Callable[[Line], Iterator[str]]

RECIPES: dict[str, Recipe] = {
    "softmax_dim": softmax_dim,
    "mask_bool": mask_bool,
    "sdpa_mask_inverted": sdpa_mask_inverted,
    "sdpa_float_mask": sdpa_float_mask,
    "missing_scale": missing_scale,
    "scale_d_model": scale_d_model,
    "double_scale": double_scale,
    "wrong_scale": scale_d_model,
    "scale_after_softmax": scale_after_softmax,
    "causal_leak": causal_leak,
    "cache_causal_alignment": bottom_right,
    "sliding_window_off_by_one": window_bound,
    "padding_on_queries": padding_on_queries,
    "mask_rank": mask_rank,
    "gqa_kv_grouping": gqa_kv_grouping,
    "fill_too_small": finite_fill,
    "fill_overflow_half": finite_fill,
    "qk_overflow_half": scale_queries_first,
    "dropout_in_eval": dropout_in_eval,
    "mask_to_additive_nan": additive_nan,
    "transpose": transpose,
    "head_merge_no_transpose": head_merge_no_transpose,
    "head_split_view": head_split_view,
    "rope_on_value": rope_on_value,
    "softcap_after_mask": cap_before_mask,
    "init_unit_variance": drawn_smaller,
    "rope_pairing_mismatch": repeated_other_way,
    "rope_low_precision": angles_in_float32,
    "rope_cache_offset": last_rows,
    "naive_exp_softmax": softmax_written_out,
}
