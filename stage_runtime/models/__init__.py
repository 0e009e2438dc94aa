"""The models a job trains and their measurement, below the trainer, the planner and the profiler.

``zoo`` (the bundled models, and a user's ``package.module:factory``), ``partition`` (the partitioner: each layer
measured, the stages balanced by time and memory) and ``layer_times`` (the measured layers as the simulator reads
them).
"""

__all__: list[str] = []
