"""stallfree: training input pipelines that never stall the step."""

from stallfree.pipeline.loader import BadSampleError, Loader
from stallfree.stage_runtime.profile import profile

__all__ = ["BadSampleError", "Loader", "profile"]

__version__ = "0.1.0"
