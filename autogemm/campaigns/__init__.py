"""Campaigns: many problems tuned by workers on every GPU and host, coordinated through a shared study database and its claim table."""
