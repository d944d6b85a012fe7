"""The engine: measure buggy/fixed attention pairs against the rounding noise floor.

Kept import-light: ``pitfalls`` imports ``harness.shapes`` and ``harness.verdicts``, so this
package must not import the registry at import time.
"""

__version__ = "0.1.0"
