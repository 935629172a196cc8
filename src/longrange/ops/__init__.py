"""Pure tensor functions: scans, convolutions and SSM kernels, each with a slow reference beside it."""
