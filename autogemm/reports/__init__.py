"""The report: an HTML page of what a cache and its studies hold."""
