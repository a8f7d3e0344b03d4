"""The user-facing API: FusionDefinition and fd.ops."""
from .fusion_definition import FusionDefinition
from .ops import FusionDefinitionError

__all__ = ["FusionDefinition", "FusionDefinitionError"]
