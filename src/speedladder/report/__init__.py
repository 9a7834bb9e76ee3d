"""Reports: everything here reads saved results (records.Results) and nothing else."""

from speedladder.report.common import gib, label
from speedladder.report.profile_notes import print_profile, profile_notes
from speedladder.report.text import notes, print_report, rows, table
from speedladder.report.tune_outcome import print_tune, tune_lines, winner_table
from speedladder.report.views import show
from speedladder.report.waterfall import COLOURS, WATERFALL, waterfall, waterfall_figure

__all__ = ["COLOURS", "WATERFALL", "gib", "label", "notes", "print_profile", "print_report", "print_tune",
           "profile_notes", "rows", "show", "table", "tune_lines", "waterfall", "waterfall_figure", "winner_table"]
