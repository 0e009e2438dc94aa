"""The profiler: the differential run, its report, what-ifs and chart."""

__all__: list[str] = []
