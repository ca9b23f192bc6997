"""On-disk formats. Each module defines one layout once; nobody else slices those bytes.

Nothing is imported here. The codec lies below this package (format.codec_layout, record_scan and
index_file import it; its compiled modules import no module that imports format, not even mqstore.model:
tests/test_layering_core.py reads their .pyx and .pxd files too).
"""
