"""The pipeline-parallel trainer: launcher, rank, feeds, the 2BW runner, evaluation, checkpoints, optimizer, report.

``trainer`` runs the jobs (``preflight`` checks their arguments first, ``step_stats`` gathers each step's
figures); it runs what ``stallfree.stage_runtime.config.TrainConfig`` describes. The planner, which predicts it, is
not imported here (``stallfree.stage_runtime.jobs`` joins the two).
"""

__all__: list[str] = []
