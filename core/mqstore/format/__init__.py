"""On-disk formats. Each module defines one layout once; nobody else slices those bytes."""
