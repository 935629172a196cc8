"""Pure tensor functions: scans, convolutions, SSM kernels and attention, each with a slow reference beside it.

    from longrange.ops import selective_scan, causal_conv1d

Exports (imported on first use, so that importing one op module does not import them all):

- :func:`selective_scan` (the signature of ``mamba_ssm``'s ``selective_scan_fn``), :func:`selective_scan_ref`;
- :func:`causal_conv1d`, :func:`causal_conv1d_update` (those of the ``causal-conv1d`` package), :func:`causal_conv1d_ref`;
- :func:`fft_conv` (causal and two-sided, no wrap-around), :func:`fft_conv_ref`;
- :func:`diag_ssm_kernel`, :func:`dplr_ssm_kernel`, :func:`vandermonde_kernel` and their ``*_ref``;
- :func:`masked_attention`, :func:`blocked_attention`, :func:`attention_ref`, :func:`admissible_ref`;
- :func:`ssd`, :func:`gla`, :func:`delta_rule`, :func:`gated_delta_rule`, :func:`mamba3`,
  :func:`mamba3_mimo` (the matrix-state recurrences, :mod:`longrange.ops.matrix_state`);
- :func:`padding_mask`.

RWKV-4's WKV is its own module, :mod:`longrange.ops.wkv` (``wkv``, ``wkv_ref``, ``wkv_step``).
"""

from longrange._exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("selective_scan", "selective_scan_ref", "linear_scan"), "longrange.ops.scan"),
    **dict.fromkeys(("causal_conv1d", "causal_conv1d_ref", "causal_conv1d_update"), "longrange.ops.conv"),
    **dict.fromkeys(("fft_conv", "fft_conv_ref"), "longrange.ops.fftconv"),
    **dict.fromkeys(
        (
            "diag_ssm_kernel",
            "diag_ssm_kernel_ref",
            "dplr_ssm_kernel",
            "dplr_ssm_kernel_ref",
            "vandermonde_kernel",
            "vandermonde_kernel_ref",
        ),
        "longrange.ops.ssm_kernels",
    ),
    **dict.fromkeys(
        ("admissible_ref", "attention_ref", "blocked_attention", "masked_attention"), "longrange.ops.attention"
    ),
    **dict.fromkeys(
        ("ssd", "gla", "delta_rule", "gated_delta_rule", "mamba3", "mamba3_mimo"), "longrange.ops.matrix_state.dispatch"
    ),
    "padding_mask": "longrange.ops.masks",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
