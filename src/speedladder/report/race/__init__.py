"""A race's report, by idea: `text` (its table and lines, the printed view), `charts` (its bars and curves, and
report.html's race section that sets them beside the table) and `compare` (the races of several runs side by side,
for `compare` and `check`)."""
