"""The zoo: the model doctor over every text architecture of the installed transformers, and
over a few of them with bugs injected as public bug reports describe them.

architectures (which model types, built how) and bugs (the injected ones) feed cases (a pytest
file of parametrized cases, one per architecture or bug, spread over processes by pytest-xdist),
whose rows table collects into the zoo's markdown table.
"""
