"""The schedule simulator and planner behind ``stallfree plan``.

``costs`` (what a stage and a link cost), ``orders`` (each rank's operations, from torch's schedule objects),
``simulate`` (one step as events), ``asynchronous`` (no-flush schedules, predicted only), ``planner`` (rank
every schedule, stage count, virtual stages, micro-batch count and split), ``timeline`` (the PNG), ``overhead``
(which host overhead a plan is charged), ``plan`` (``stallfree.plan``: all of it as one function) and ``handoff``
(``plan.json``, written and read).
"""

__all__: list[str] = []
