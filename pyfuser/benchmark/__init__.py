"""Benchmarks against peers (GPU only); `python -m pyfuser bench` runs them."""
