"""Triton providers slot."""
