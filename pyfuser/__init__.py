"""pyfuser: a fusion code generator for NVIDIA GPUs.

    from pyfuser import FusionDefinition, DataType
"""
from .frontend import FusionDefinition, FusionDefinitionError
from .ir import DataType, ParallelType
from .runtime.explain import Explanation, explain_fusion
from .runtime.inputs import InputError

__version__ = "0.1.0"

__all__ = ["DataType", "Explanation", "FusionDefinition", "FusionDefinitionError", "InputError",
           "ParallelType", "explain_fusion", "__version__"]
