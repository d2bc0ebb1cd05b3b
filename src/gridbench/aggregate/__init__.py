"""Aggregation: raw results to the dataset, graphs and the report."""
