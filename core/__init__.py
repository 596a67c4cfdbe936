"""foreshock: predict GPU throttling, link failures and failure cascades in GPU training clusters.

This package (folder ``core/``) is the ground floor: the field table, topology, frames,
recordings, ground-truth events, findings and pipeline health. It imports nothing from the
other folders.
"""

__version__ = "0.1.0"
