"""stallfree: training input pipelines that never stall the step."""

from stallfree.pipeline.loader import BadSampleError, Loader

__all__ = ["BadSampleError", "Loader"]

__version__ = "0.1.0"
