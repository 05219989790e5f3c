"""What tuning leaves behind and serving reads: records, the cache files and their merging, provenance, and the predictor's model over records."""
