"""The catalogue's data: one folder per trap, each a card plus a buggy/fixed pair of modules.

A folder ``pitfalls/<id>/`` holds ``__init__.py`` (its ``CARD`` and any experiment particular to
the trap), ``buggy.py``, ``fixed.py`` and ``test_<id>.py``. ``harness.catalogue.registry``
discovers the folders; the checks every pair shares are in ``test_pairs.py``.
"""
