"""Running stages concurrently and timing them: the stage clock, the pipeline-parallel trainer, the profiler.

Floors, top down (``lint-imports`` holds them):

- ``jobs``: ``stallfree.train``: a job run by the trainer, its books kept by the planner's simulator;
- ``train`` (the trainer), ``plan`` (the simulator and planner), ``profile`` (the profiler): independent of each
  other;
- what they share: ``config`` (``TrainConfig``), ``models`` (the zoo, the partitioner, the measured layers),
  ``stage`` (the timed pipeline stage) and ``baseline`` (the torch DataLoader baseline);
- at the bottom: ``schedules`` (the table of schedules), ``link_delay``, ``factories``, ``processes``,
  ``stage_times`` (the simulated device's time per stage) and ``clock`` (the stage clock).
"""

__all__: list[str] = []
