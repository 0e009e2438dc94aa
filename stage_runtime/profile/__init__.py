"""The profiler: the differential run, its report, what-ifs and chart.

``loop`` (``stallfree.profile``: any loader's run, timed), ``dataset`` (``stallfree.profile_dataset``: the five
phases) and ``phases``; ``report`` (the stalls and the bottleneck), ``what_ifs``, ``schema`` (``profile.json``),
``verify`` (a what-if run for real), the charts and the text.
"""

__all__: list[str] = []
