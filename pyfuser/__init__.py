"""pyfuser: a fusion code generator for NVIDIA GPUs.

    from pyfuser import FusionDefinition, DataType
"""
from .frontend import FusionDefinition, FusionDefinitionError
from .ir import DataType, ParallelType
from .runtime.explain import Explanation, explain_fusion
from .runtime.index_check import IndexOutOfRange, check_index_errors
from .runtime.inputs import InputError

__version__ = "0.1.0"

__all__ = ["DataType", "Explanation", "FusionDefinition", "FusionDefinitionError",
           "IndexOutOfRange", "InputError", "ParallelType", "check_index_errors", "explain_fusion",
           "__version__"]
