"""torch_npu providers (filled below)."""
