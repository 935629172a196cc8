"""Generators of synthetic benchmarks (ListOps, Pathfinder), writing the published file formats."""
