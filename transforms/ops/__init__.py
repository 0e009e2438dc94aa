"""The spec's steps, under torchvision's names and with its semantics, each able to put itself into a DALI graph.

Geometry: ``resize`` (RandomResizedCrop, Resize), ``rescale`` (resizes to a drawn size), ``geometry`` (Pad, RandomCrop,
CenterCrop, RandomZoomOut), ``flip``, ``warp`` (rotations, affine, perspective). Pixels: ``normalize``, ``color``
(ColorJitter and the photometric distortion), ``adjust`` (invert, autocontrast, equalize, sharpness), ``bundled``
(erasing, cutout, noise, solarize, posterize: kernels DALI does not ship), ``grayscale``, ``blur``, ``jpeg``. Choices:
``containers`` (RandomApply, RandomChoice, RandomOrder), ``policies`` (AutoAugment and kin), ``augmix``, and
``compose``. Users import them from :mod:`stallfree.transforms`; nothing is imported here.
"""

__all__: list[str] = []
