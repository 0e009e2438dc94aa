"""What a training job is, below the trainer and the planner: ``TrainConfig`` and its parts, checked when built.

The trainer runs a job from it, the planner predicts it and reads a finished job's back from its summary, and
``stallfree train --help`` builds its flags from it without importing torch.
"""

__all__: list[str] = []
