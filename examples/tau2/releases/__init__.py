"""tau2 releases side by side: which one is imported, and where their grading of a task differs."""
