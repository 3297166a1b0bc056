"""Reporting conventions: typed Parquet tables and PNG+PDF figures, written atomically."""

from pipeline.reporting.tables import read_table, write_table
from pipeline.reporting.figures import save_figure

__all__ = ["read_table", "write_table", "save_figure"]
