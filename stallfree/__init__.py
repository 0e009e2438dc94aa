"""stallfree: training input pipelines that never stall the step."""

__all__: list[str] = []

__version__ = "0.1.0"
