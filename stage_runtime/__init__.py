"""Running stages concurrently and timing them: the stage clock, the pipeline-parallel trainer, the profiler."""

__all__: list[str] = []
