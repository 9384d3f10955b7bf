"""Wan 2.1 / 2.2 (`WanTransformer3DModel`; Wan 2.2 pipelines hold `transformer` and `transformer_2`)."""

from .registry import Adapter, register_adapter

WAN = Adapter(name="wan", blocks=("WanTransformerBlock",))
register_adapter("WanTransformer3DModel", WAN)
