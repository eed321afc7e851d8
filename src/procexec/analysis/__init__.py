"""What the study reports: the aggregate, figures, tables, the reproduction verdict and the HTML report."""
