"""The paper's figures (2-5, 8-19, G.1-G.7 = 20-124) and the beyond-the-paper diagnostics.

Each figure is a ``FigureSpec`` (``specs``): a builder (``builders``) turns the aggregated
metrics / per-example scores (``inputs``) into a small tidy frame in the parent process,
and one of four plotting helpers (``plots``: lines, heatmap, boxes, stacked bars) draws
it in a worker process.  Only small tidy frames cross the process boundary, so the
~825k score rows are read once and the drawing (the slow part) runs in parallel.  A
``manifest.json`` in the output folder lists every figure, its files and caption; the
report reads it.  The figures and the manifest are written as one ``FileSet``
(``write``; workers draw into its temporary files): a failure or a kill leaves the
previous figures and manifest as they were.
"""
