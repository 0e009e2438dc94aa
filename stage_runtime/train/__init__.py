"""The pipeline-parallel trainer: launcher, rank, feeds, the 2BW runner, checkpoints, optimizer, report.

It runs what ``stallfree.stage_runtime.config.TrainConfig`` describes; the planner, which predicts it, is not
imported here (``stallfree.stage_runtime.jobs`` joins the two).
"""

__all__: list[str] = []
