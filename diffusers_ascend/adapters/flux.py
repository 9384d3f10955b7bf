"""Flux (`FluxTransformer2DModel`): double-stream and single-stream blocks."""

from .registry import Adapter, register_adapter

FLUX = Adapter(name="flux", blocks=("FluxTransformerBlock", "FluxSingleTransformerBlock"))
register_adapter("FluxTransformer2DModel", FLUX)
