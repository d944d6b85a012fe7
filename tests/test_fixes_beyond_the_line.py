"""Fixes that need more than their own line, each proven on a module written in one library's
style, the line to fix marked ``# BUG`` (kept apart from test_fixes.py so the two files run on
two workers)."""

from pathlib import Path

import pytest

from harness.doctor import Config
from tests import fix_modules as fm
from tests.test_fixes import _fixes


@pytest.mark.parametrize(
    ("module", "config", "trap", "written"),
    [
        (
            fm.SplitScale(64, 4),
            Config(),
            "scale_d_model",
            "scale = (n_state // self.n_head)**-0.25",
        ),
        (
            fm.RotatesValues(64, 4),
            Config(causal=True, positions="relative"),
            "rope_on_value",
            "q, k = apply_rotary(q, k, angles.cos(), angles.sin())",
        ),
        (
            fm.UnscaledProduct(64, 4),
            Config(causal=True, positions="relative"),
            "missing_scale",
            "return alibi.baddbmm(batch1=q, batch2=k, alpha=q.size(-1) ** -0.5)",
        ),
        (
            fm.CausalAndPadding(64, 4),
            Config(causal=True, mask="keep", mask_shape="bk"),
            "mask_bool",
            "keep = keep & (attention_mask[:, None, None, :] == 1)",
        ),
        (
            fm.WideBand(64, 4),
            Config(causal=True, window=4),
            "sliding_window_off_by_one",
            "blocked = (j > i) | (i - j >= self.window)",
        ),
        (fm.RootForgotten(64, 4), Config(), "double_scale", ") / self.head_dim ** 0.5"),
        (
            fm.PaddingTurned(64, 4),
            Config(mask="additive", mask_shape="b11k"),
            "padding_on_queries",
            "attention_scores = attention_scores + attention_mask",
        ),
        (
            fm.FillByName(64, 4),
            Config(causal=True),
            "fill_too_small",
            "attn_weights = torch.where(causal_mask, attn_weights, "
            "torch.finfo(attn_weights.dtype).min)",
        ),
        (
            fm.SequenceFirstMerge(64, 4),
            Config(sequence_first=True),
            "head_merge_no_transpose",
            "attn_output = attn_output.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)",
        ),
        (
            fm.AdditiveNaN(64, 4),
            Config(mask="keep"),
            "mask_to_additive_nan",
            "adder = torch.zeros_like(1.0 - mask[:, None].to(x.dtype)).masked_fill("
            '(1.0 - mask[:, None].to(x.dtype)) != 0, float("-inf"))',
        ),
        (
            fm.AdditiveNaNToSDPA(64, 4),
            Config(mask="keep"),
            "mask_to_additive_nan",
            "adder = torch.zeros_like(1.0 - mask[:, None].to(x.dtype)).masked_fill("
            '(1.0 - mask[:, None].to(x.dtype)) != 0, float("-inf"))',
        ),
        (
            fm.StridedCopies(64, 4),
            Config(causal=True, positions="relative", kv_grouping="blocks"),
            "gqa_kv_grouping",
            "hidden_states = hidden_states[:, :, None, :, :].expand(b, kv, n_rep, t, d)",
        ),
        (
            fm.ValuesRotatedApart(64, 4),
            Config(causal=True, positions="relative", kv_grouping="blocks"),
            "rope_on_value",
            "query_states, key_states = apply_rotary(query_states, key_states, cos, sin)",
        ),
        (
            fm.AlibiPaddingTurned(64, 4),
            Config(causal=True, positions="relative", mask="keep", mask_shape="bk"),
            "padding_on_queries",
            "attn_mask = attn_mask + padding[:, None, None, :]",
        ),
        (fm.WidthRootBelow(64, 4), Config(), "scale_d_model", ") / math.sqrt(self.head_dim)"),
        (
            fm.QueriesSplitByView(64, 4),
            Config(),
            "head_split_view",
            "q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)",
        ),
        (
            fm.FusedSplitCut(64, 4),
            Config(),
            "head_split_view",
            "qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(0, 2, 3, "
            "1, 4).transpose(0, 1)",
        ),
        (
            fm.OwnKeyBlocked(64, 4),
            Config(causal=True),
            "causal_leak",
            'causal_mask = torch.full((T, T), float("-inf")).triu(diagonal=1)',
        ),
        (
            fm.UnscaledByDesignScaled(64, 4),
            Config(scale=1.0),
            "double_scale",
            "scores = torch.matmul(q, k.transpose(3, 2))",
        ),
        (
            fm.RateReadTwice(64, 4),
            Config(mask="keep", mask_shape="bk"),
            "dropout_in_eval",
            "dropout_p = self.attention_dropout if self.training else 0.0",
        ),
        (
            fm.CombinedMaskPaddingTurned(64, 4),
            Config(causal=True, mask="keep", mask_shape="bk", positions="relative"),
            "mask_bool",
            "blocked = future | ~attention_mask[:, None, None, :].bool()",
        ),
        (
            fm.WindowJoinedToPadding(64, 4),
            Config(causal=True, mask="keep", mask_shape="bk", window=4),
            "sliding_window_off_by_one",
            "return (j <= i) & (j > i - self.window)",
        ),
        (
            fm.TriangleInPlaceBeforeFold(64, 4),
            Config(causal=True),
            "causal_leak",
            "future = torch.full((T, T), torch.finfo(scores.dtype).min).triu_(1)",
        ),
        (
            fm.CapAroundMask(64, 4),
            Config(causal=True, softcap=50.0),
            "softcap_after_mask",
            "scores = self.softcap * torch.tanh(scores / self.softcap) + future",
        ),
        (
            fm.KeysSwappedWithHeads(64, 4),
            Config(),
            "transpose",
            "scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))",
        ),
        (
            fm.ShapeWrittenAlongQueries(64, 4),
            Config(mask="keep", mask_shape="bk"),
            "padding_on_queries",
            "mask_shape = (bs, 1, 1, k_length)",
        ),
        (
            fm.QueriesRowPerHead(64, 4),
            Config(causal=True, mask="keep", mask_shape="bk"),
            "padding_on_queries",
            "return ~attention_mask.bool()[:, None, None, :]",
        ),
        (
            fm.WeightsCastThenScaled(64, 4),
            Config(),
            "scale_after_softmax",
            "weights = F.softmax(scores * self.scaling, dim=-1, dtype=torch.float32).to(q.dtype)",
        ),
        (
            fm.FoldedMergedStraight(64, 4),
            Config(),
            "head_merge_no_transpose",
            "out = out.reshape(b, -1, n, out.size(-1)).transpose(1, 2).reshape(b, n, -1)",
        ),
        (
            fm.GridMergedStraight(64, 4),
            Config(call=fm.on_grid, positions="relative"),
            "head_merge_no_transpose",
            "x = (attn @ v).unflatten(0, (B, -1)).movedim(1, -2).contiguous().view(B, H, W, -1)",
        ),
        (
            fm.CosineSplitStraight(64, 4),
            Config(),
            "head_split_view",
            "qkv = qkv.reshape(B, N, 3, self.num_heads, -1).permute(0, 2, 3, 1, 4).transpose(0, 1)",
        ),
        (
            fm.TableForOtherPairs(64, 4),
            Config(positions="relative", rope_pairing="half", rotary_dims=8),
            "rope_pairing_mismatch",
            "emb = torch.cat((freqs, freqs), dim=-1)",
        ),
        (
            fm.NormedQueriesScaledTwice(64, 4),
            Config(causal=True),
            "double_scale",
            "q = q",
        ),
        (
            fm.WeightsKeptAside(64, 4),
            Config(),
            "softmax_dim",
            "weights = F.softmax(scores, dim=-1)",
        ),
        (
            fm.RotatesThreeByHelper(64, 4),
            Config(positions="relative", rope_pairing="interleaved"),
            "rope_on_value",
            "q, k = self.rotate(position_ids, q, k)",
        ),
        (
            fm.TurnedBeforeProjecting(64, 4),
            Config(positions="absolute"),
            "rope_on_value",
            "query_key_states = self.turned(query_key_states)",
        ),
        (
            fm.ChosenInsideCap(64, 4),
            Config(causal=True, softcap=30.0),
            "softcap_after_mask",
            "logits = torch.where(keep, cap * torch.tanh(logits / cap), -1e30)",
        ),
        (
            fm.MultiplierDropped(64, 4),
            Config(scale=0.0625),
            "missing_scale",
            "scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling",
        ),
        (
            fm.SmallAddedFillToSDPA(64, 4),
            Config(causal=True),
            "fill_too_small",
            'attn_mask = torch.full((T, T), float("-inf"), dtype=q.dtype).triu(1)',
        ),
        (
            fm.SmallInitSmallFill(64, 4),
            Config(causal=True, mask="drop", mask_shape="b1qk"),
            "fill_too_small",
            "scores = scores.masked_fill(attention_mask, torch.finfo(scores.dtype).min)",
        ),
        (
            fm.TriangleJoinedToCallersMask(64, 4),
            Config(causal=True, mask="drop", mask_shape="b1qk"),
            "causal_leak",
            "future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)",
        ),
        (
            fm.MultiQueryGroupsTiled(64, 4),
            Config(causal=True, kv_heads=2, kv_grouping="blocks"),
            "gqa_kv_grouping",
            "k, v = (t.unsqueeze(-2).expand(-1, -1, -1, n_rep, -1) for t in (k, v))",
        ),
        (
            fm.BlockedMaskToSDPA(64, 4),
            Config(causal=True, mask="keep", mask_shape="bk"),
            "sdpa_mask_inverted",
            "out = F.scaled_dot_product_attention(q, k, v, attn_mask=~blocked)",
        ),
        (
            fm.GroupedQueriesPaddedAlongQueries(64, 4),
            Config(mask="keep", mask_shape="bk", kv_heads=2),
            "padding_on_queries",
            "keep = mask[:, None, None, None, :].bool()",
        ),
        (
            fm.RotaryFlagDiffers(64, 4),
            Config(causal=True, positions="relative", rope_pairing="half"),
            "rope_pairing_mismatch",
            "k = rotated(k, cos, sin, interleaved=False)",
        ),
        (
            fm.HeadsPermutedIntoPositions(64, 4),
            Config(),
            "head_split_view",
            "qkv = self.qkv(x).reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)",
        ),
        (
            fm.HeadNormedScaledTwice(64, 4),
            Config(),
            "double_scale",
            "scores = torch.matmul(q * self.scaling, k.transpose(2, 3))",
        ),
        (
            fm.AnglesInHalf(64, 4),
            Config(causal=True, positions="relative", rope_pairing="half"),
            "rope_low_precision",
            "freqs = (inv.float() @ pos.float()).transpose(1, 2)",
        ),
        (
            fm.PiecesScaledByWidth(64, 4),
            Config(causal=True, scale=24**-0.5),
            "scale_d_model",
            "softmax_scale = self.head_dim**-0.5",
        ),
        (
            fm.SplitThenViewedHeadsFirst(64, 4),
            Config(causal=True),
            "head_split_view",
            "q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)",
        ),
        (
            fm.KeysTiledValuesInBlocks(64, 4),
            Config(causal=True, kv_heads=2, kv_grouping="blocks"),
            "gqa_kv_grouping",
            "k = k.repeat_interleave(q_per_kv, dim=1)",
        ),
        (
            fm.WindowedPaddingOnQueries(64, 4),
            Config(mask="keep", mask_shape="bk", positions="relative"),
            "padding_on_queries",
            "allowed = attention_mask.bool()[:, None, None, :]",
        ),
        (
            fm.GivenMaskTransposed(64, 4),
            Config(causal=True, mask="additive", mask_shape="b1qk"),
            "causal_leak",
            "scores = scores + attention_mask",
        ),
        (
            fm.SoftmaxWrittenOut(64, 4),
            Config(causal=True),
            "naive_exp_softmax",
            "weights = s.softmax(dim=-1).type_as(q)",
        ),
        (
            fm.WindowTimesInfinity(64, 4),
            Config(causal=True, mask="additive", mask_shape="b1qk", window=4),
            "mask_to_additive_nan",
            'attention_mask = attention_mask + far.float().masked_fill(far != 0, float("-inf"))',
        ),
        (
            fm.MaskCastBeforeTheCall(64, 4),
            Config(mask="keep", mask_shape="bk"),
            "sdpa_float_mask",
            "mask = mask.bool()",
        ),
        (
            fm.HeadNormsPartialRotaryScaledTwice(64, 4),
            Config(causal=True, positions="relative", rope_pairing="half", rotary_dims=4),
            "double_scale",
            "q = torch.cat((q_rot, q[..., rot:]), dim=-1)",
        ),
        (
            fm.TableForPairsTurnedInHalves(64, 4),
            Config(mask="additive", mask_shape="b11k", positions="relative", rope_pairing="half"),
            "rope_pairing_mismatch",
            "emb = torch.cat((freqs, freqs), dim=-1)",
        ),
    ],
    ids=[
        "split-scale",
        "rotary-pair",
        "baddbmm-alpha",
        "causal-and-padding",
        "window-bound",
        "root-forgotten",
        "padding-turned",
        "fill-by-name",
        "sequence-first-merge",
        "additive-nan",
        "additive-nan-to-sdpa",
        "repeat-kv-expanded",
        "values-rotated-apart",
        "alibi-padding-turned",
        "width-root-below",
        "queries-split-by-view",
        "fused-split-cut",
        "own-key-blocked",
        "unscaled-by-design-scaled",
        "rate-read-twice",
        "combined-mask-padding-turned",
        "window-joined-to-padding",
        "triangle-in-place-before-fold",
        "cap-around-mask",
        "keys-swapped-with-heads",
        "shape-written-along-queries",
        "queries-row-per-head",
        "weights-cast-then-scaled",
        "folded-merged-straight",
        "grid-merged-straight",
        "cosine-split-straight",
        "table-for-other-pairs",
        "normed-queries-scaled-twice",
        "weights-kept-aside",
        "rotates-three-by-helper",
        "values-turned-before-projecting",
        "chosen-inside-cap",
        "multiplier-dropped",
        "small-added-fill-to-sdpa",
        "small-init-small-fill",
        "triangle-joined-to-callers-mask",
        "multi-query-groups-tiled",
        "blocked-mask-to-sdpa",
        "grouped-queries-padded-along-queries",
        "rotary-flag-differs",
        "heads-permuted-into-positions",
        "head-normed-scaled-twice",
        "angles-in-half",
        "pieces-scaled-by-width",
        "split-then-viewed-heads-first",
        "keys-tiled-values-in-blocks",
        "windowed-padding-on-queries",
        "given-mask-transposed",
        "softmax-written-out",
        "window-times-infinity",
        "mask-cast-before-the-call",
        "head-norms-partial-rotary-scaled-twice",
        "table-for-pairs-turned-in-halves",
    ],
)
def test_a_fix_that_needs_more_than_its_line_is_found_and_proven(module, config, trap, written):
    """Whisper's scale needs the head count in scope; a rotary pair, the tensor made beside
    the one it rotates; BLOOM's ``baddbmm``, its ``alpha``; CLIP's mask of two, the padding
    test where the mask is made; a window, its bound: each on the line marked ``# BUG``."""
    d, [fix] = _fixes(module, config)
    assert d.causes[0].trap == trap, d.text()
    source = Path(fm.__file__).read_text().splitlines()
    assert source[fix.number - 1].endswith("# BUG"), fix
    assert fix.after[0].split("  #")[0].strip() == written, fix
    assert fix.proof == "with this change every probe passes", fix
