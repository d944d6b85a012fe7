"""What the command line offers before it imports anything heavy: the dtypes of a grid, by
name, and the learning probe's training steps. ``harness.devices`` and ``harness.learning`` take
theirs from here, so that parsing a command line (and a report with nothing to do) never waits
for torch."""

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # a grid's dtypes, in the report's order
LEARN_STEPS = 120  # the learning probe's training steps (harness.learning.STEPS)
