"""timings.md, beside report.md: the wall-clock measurements, which vary from run to run and so
stay out of the report."""

from __future__ import annotations

import pandas as pd

from harness.files import REPORT
from harness.report.format import table


def timings_text(timed: dict[str, pd.DataFrame]) -> str:
    lines = [
        "# Wall-clock measurements",
        "",
        f"Not deterministic: they vary from run to run and machine to machine, so they live apart "
        f"from [{REPORT}]({REPORT}).",
    ]
    for pid, df in timed.items():
        lines += ["", f"## `{pid}`", "", table(df)]
    return "\n".join(lines) + "\n"
