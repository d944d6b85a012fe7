"""scale_d_model: the shared pair checks, flatter attention, and a bug one head hides."""

from harness.testing import assert_hidden_by_one_head


def test_attention_is_flatter_and_invisible_with_one_head(device):
    m = assert_hidden_by_one_head("scale_d_model", device)
    entropy = m.attention.set_index("run")["entropy_mean"]
    assert entropy["bug"] > entropy["fix"]
