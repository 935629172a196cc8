"""Matrix-state recurrences: Mamba-2's SSD, GLA, DeltaNet, Gated DeltaNet and Mamba-3.

Each keeps, per head, a state matrix ``S`` (dk x dv) that decays, receives a rank-one write and,
for the delta rule, a rank-one erase at every position, and is read by ``o_t = q_t S_t``:

==================  ===========================================================  ==============
op                  recurrence                                                   paper
==================  ===========================================================  ==============
``ssd``             S_t = exp(dt_t A) S_{t-1} + dt_t B_t^T x_t;  y_t = C_t S_t + D x_t   arXiv 2405.21060
``gla``             S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t;   o_t = scale q_t S_t     arXiv 2312.06635
``delta_rule``      S_t = (I - b_t k_t^T k_t) S_{t-1} + b_t k_t^T v_t                     arXiv 2406.06484
``gated_delta_rule`` S_t = exp(g_t) (I - b_t k_t^T k_t) S_{t-1} + b_t k_t^T v_t           arXiv 2412.06464
``mamba3``          Mamba-3 SISO: trapezoidal discretisation, data-dependent rotations   arXiv 2603.15569
``mamba3_mimo``     Mamba-3 MIMO: the same with rank-r writes and reads per position      arXiv 2603.15569
==================  ===========================================================  ==============

Conventions (:mod:`.common`): sequences (batch, length, heads, features), states (batch, heads,
dk, dv), an optional boolean ``mask`` (batch, length) True at real positions, through whose padded
positions the state is carried unchanged; float64 in, float64 computed.

Per op, one module with three forms, every one tested against the first:

- ``*_naive``: a loop over time, the ground truth (float64-capable, slow);
- ``*_chunk``: the chunkwise-parallel form in PyTorch (matmuls within chunks of ``chunk_size``
  positions, a pass of states between chunks), the portable default, differentiable by autograd;
- ``*_step``: one position, for generation.

The entry points (:mod:`.dispatch`, also exported by :mod:`longrange.ops`) ``ssd``, ``gla``,
``delta_rule``, ``gated_delta_rule``, ``mamba3`` and ``mamba3_mimo`` (the names of the modules of
this package are the families': :mod:`.ssd`, :mod:`.gla`, :mod:`.delta_rule`, :mod:`.mamba3`,
:mod:`.mamba3_mimo`) run the implementation named by ``impl`` (``"auto"``, ``"chunk"``, ``"naive"``; for SSD, GLA and the
delta rules on CPUs ``"numba"``, compiled loops for small heads (:mod:`.numba`); and on CUDA the maintained
kernels where installed and working: flash-linear-attention's for GLA and the delta rules,
mamba-ssm's for SSD), following the ops' one dispatch convention.
"""
