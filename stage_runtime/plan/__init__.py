"""The schedule simulator and planner behind ``stallfree plan``.

``costs`` (what a stage and a link cost), ``orders`` (each rank's operations, from torch's schedule objects),
``simulate`` (one step as events), ``asynchronous`` (no-flush schedules, predicted only), ``planner`` (rank
every schedule, stage count, virtual stages, micro-batch count and split), ``timeline`` (the PNG), ``overhead``
(which host overhead a plan is charged), ``calibrate`` and ``calibration`` (the host's overhead measured, and kept),
``attribution`` and ``pilots`` (overhead read from measured spans), ``books`` (a step's time split into its
losses), ``predict`` (a training job's step), ``plan`` (``stallfree.plan``: all of it as one function) and
``handoff`` (``plan.json``, written and read). It imports nothing of the trainer's (``lint-imports`` holds it).
"""

__all__: list[str] = []
