"""Evaluation: pass^k / pass@k with bootstrap intervals, and comparing evaluation runs."""
