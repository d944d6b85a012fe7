"""The tutorial itself as a subject: the claims it makes that no pair measures (``claims``), and
its own modules (``pitfalls/tutorial.py``) run as written and through the doctor (``own_code``).
The report's scorecard (``harness.report.scorecard``) judges every claim from these and from the
pairs' measurements."""
