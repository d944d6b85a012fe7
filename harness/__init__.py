"""The engine: measure buggy/fixed attention pairs against the rounding noise floor.

One core (errors, devices, shapes, masks, inputs, runner, metrics, reference, dependency) and two
wings over it: ``harness.catalogue`` measures buggy/fixed pairs, ``harness.doctor`` diagnoses
anyone's module. The faces (cli, report, plots, files, progress, plugin) and the bridges (testing,
validation) sit on top. Kept import-light: the pytest plugin and every card import from here.
"""

__version__ = "0.1.0"
