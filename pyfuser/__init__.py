"""pyfuser: a fusion code generator for NVIDIA GPUs."""
