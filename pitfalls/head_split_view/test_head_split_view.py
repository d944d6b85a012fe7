"""head_split_view: the shared pair checks, and a bug one head cannot show."""

from harness.testing import assert_hidden_by_one_head


def test_benign_with_one_head_silent_with_four(device):
    assert_hidden_by_one_head("head_split_view", device)
