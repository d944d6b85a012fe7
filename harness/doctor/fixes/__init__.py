"""The doctor's fixes: a named trap's line rewritten as the catalogue fixes it, proven by
diagnosing the rewritten code before it is shown (``propose``)."""

from harness.doctor.fixes.prove import Fix, Fixes, propose

__all__ = ["Fix", "Fixes", "propose"]
