"""Reproducible comparisons against the tools users would pick instead, on the same data in one run."""

__all__: list[str] = []
