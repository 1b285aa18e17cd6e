"""Relay numbers: scrape /metrics and /stats, and probe a relay known only by its key over the DHT."""
