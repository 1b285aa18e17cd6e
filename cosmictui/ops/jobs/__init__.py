"""Jobs: parse the jobs list, list them on a deployment, recover stuck ones, and whether new
ones went through the relay."""
