"""Experiments built on the library: the quality study (``study``) and its learning curves (``curves``)."""
