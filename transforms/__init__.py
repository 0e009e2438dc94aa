"""The augmentation spec (torchvision names) and its compilation to DALI operators."""

__all__: list[str] = []
