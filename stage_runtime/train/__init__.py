"""The pipeline-parallel trainer: config, partitioner, schedules, launcher, rank, feeds, checkpoints, report."""

__all__: list[str] = []
