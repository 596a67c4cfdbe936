"""Corrupting one data page of a Parquet part behind its sound footer: ``Recording.open`` checks
footers only, so the page is found bad only when it is read (replay and agent tests)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def corrupt_page(part: Path, column_name: str, row_group: int = -1, at: int = 40, length: int = 30) -> None:
    """Flip ``length`` bytes ``at`` bytes into the first data page of ``column_name`` in
    ``row_group`` (-1: the last) of ``part``."""
    meta = pq.ParquetFile(part).metadata
    group = meta.row_group(row_group % meta.num_row_groups)
    column = next(i for i in range(meta.num_columns) if group.column(i).path_in_schema == column_name)
    data = bytearray(part.read_bytes())
    page = group.column(column).data_page_offset + at
    data[page:page + length] = bytes(b ^ 0xFF for b in data[page:page + length])
    part.write_bytes(bytes(data))
