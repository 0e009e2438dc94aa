"""The translation of torchvision's own transform objects into the spec's steps (``Loader(transform=T.Compose(...))``).

``translator`` (``to_steps``: what a user passes as ``transform=``, torchvision's objects and stallfree's steps alike,
into the steps and the output dtype they imply; the type conversions, resizes, flips, containers and policies),
``geometry`` (crops with padding, warps, drawn-size resizes) and ``photometric`` (colour, adjustments, blur, noise,
JPEG, AugMix). Nothing here imports torchvision: its classes are recognised by the module their type comes from.
"""

__all__: list[str] = []
