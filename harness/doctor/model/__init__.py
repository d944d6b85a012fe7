"""The doctor on a whole model: the model is its own adapter.

call (how to run the model on token ids) -> layers (find its attention layers by what they
compute, recording how the model calls each) -> replay (a layer's probes, called as its model
calls it) and properties (what the whole model must show: causality, batch independence, left
padding, its cache, its backends, low precision) -> report (one table of layers, then the
model's properties).
"""
