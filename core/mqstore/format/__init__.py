"""On-disk formats. Each module defines one layout once; nobody else slices those bytes."""

from mqstore.format import codec_layout  # noqa: F401  (the compiled codec checked against these layouts)
