"""The longrange package: see longrange.cli for the command line."""
