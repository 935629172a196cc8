"""How large a temporary the ops allow themselves, and why.

On CPUs, the C allocator serves allocations above its mmap threshold (at most 32 MB with glibc)
by mapping fresh memory every time, and the kernel zeroes those pages on first touch. For long
sequences this zeroing dominated the step time of the S4D and S6 blocks (more than half of an S6
block's step at length 8192). The ops therefore work through their largest temporaries in pieces
of at most :data:`TEMPORARY_BYTES`: along the length for the selective scan, over channels for
FFT convolutions and Vandermonde kernels. The results are the same.
"""

#: Largest temporary of one piece of work, in bytes.
TEMPORARY_BYTES = 16 * 2**20


def group_size(bytes_per_item: int, limit: int = TEMPORARY_BYTES) -> int:
    """How many items of ``bytes_per_item`` fit in ``limit`` bytes (at least one). The ops work in one
    piece on the ``meta`` device (dry runs), which allocates nothing."""
    return max(1, limit // max(bytes_per_item, 1))


def balanced_group_size(count: int, bytes_per_item: int, limit: int = TEMPORARY_BYTES) -> int:
    """The size of the fewest groups of ``count`` items of ``bytes_per_item`` that each stay within
    ``limit`` bytes, evened out (sizes ceil(count / groups)): 64 channels of which 63 fit make two
    groups of 32, not 63 and 1."""
    most = group_size(bytes_per_item, limit)
    groups = -(-count // most)
    return -(-count // groups)
