"""head_merge_no_transpose: the shared pair checks, and a bug one head cannot show."""

from harness.testing import assert_hidden_by_one_head


def test_benign_with_one_head_silent_with_four(device):
    m = assert_hidden_by_one_head("head_merge_no_transpose", device)
    att = m.attention.set_index("run")
    assert att.loc["bug"].equals(att.loc["fix"])  # the weights are right; the merge is not
