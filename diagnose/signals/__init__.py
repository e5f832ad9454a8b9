"""Named signals: the catalogue every signal is declared in, and the workload card and observed traffic derived from the tables."""
