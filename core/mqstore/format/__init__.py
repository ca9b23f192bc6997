"""On-disk formats. Each module defines one layout once; nobody else slices those bytes.

Nothing is imported here: mqstore.codec's compiled modules import mqstore.model, which imports
format.record, so an import of the codec from this package would be circular (format.codec_layout).
"""
