"""The kernels stallfree ships, the pixel work of its steps: Numba functions for the CPU and ``numba.cuda`` for the GPU.

``filters`` (PIL's resampling filters: taps and weights), ``resample`` (the CPU resampler's sums), ``resample_cuda``
(the same on the GPU), ``resample_node`` (the resampler as DALI graph nodes), ``entries`` (the resampler's and
ColorJitter's cached CPU entry points), ``color`` (ColorJitter's pixel steps), ``warp`` (PIL's affine and perspective
engines) and ``gather`` (rows and columns picked by index). Nothing is imported here: each module is imported by
name, so that a graph compiles or loads only the kernels it uses.
"""

__all__: list[str] = []
