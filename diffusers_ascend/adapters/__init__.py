"""Model-family adapters (see `registry`)."""

from .registry import Adapter, adapter_for, register_adapter

__all__ = ["Adapter", "adapter_for", "register_adapter"]
