"""The bottom floor: what every floor uses and none owns (DESIGN.md, "The house").

The resume contract (:mod:`.resume`), the DALI import check (:mod:`.dali`), the one atomic write with fsync
(:mod:`.atomic`), the cache home (:mod:`.home`), the keyed mixer every random draw and the order use
(:mod:`.mixer`) and the CPU-seconds meter the benchmarks use (:mod:`.cpu`). Nothing here knows about images, data
or models, and nothing here imports another floor of stallfree.
"""

__all__: list[str] = []
